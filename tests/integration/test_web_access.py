"""Who may read what over the web, on a real worker: tokens for task data, the Host check, the open mode's bind,
and the list views that page instead of loading everything."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from agents_stream.contract import topics

from .harness import create_topics, encode, eventually, produce, task, unique

WRITE, READ = "access-write-token", "access-read-token"
OPEN_PATHS = ["/healthz", "/readyz", "/metrics", "/"]


async def fetch(w: Any, path: str, *, token: str | None = None, host: str | None = None) -> tuple[int, Any, Any]:
    """GET ``path`` with this token and Host header: (status, JSON or text, headers)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if host:
        headers["Host"] = host
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{w.web_port}{path}", headers=headers,
                               timeout=aiohttp.ClientTimeout(total=30)) as r:
            body = await r.json() if r.content_type == "application/json" else await r.text()
            return r.status, body, r.headers


async def test_task_data_needs_the_read_or_the_write_token(cluster_factory):
    """/tasks, /approvals, /dlq, /dlq/<ref> and /circuits answer 401 without a token or with a wrong one, and
    answer the read token and the write token; the probes, /metrics and the console page need none; the read
    token decides nothing."""
    agent = unique("access")
    c = cluster_factory([agent], None, AGENTS_STREAM_API_TOKEN=WRITE, AGENTS_STREAM_READ_TOKEN=READ)
    w = await c.started()
    data_paths = ["/tasks/no-such-task", "/approvals", f"/dlq?agent={agent}",
                  f"/dlq/{topics.dlq_topic(agent)}:0:0", "/circuits"]
    for path in data_paths:
        for token in (None, "wrong", f"{READ}x"):
            status, body, _ = await fetch(w, path, token=token)
            assert status == 401 and "bearer token" in body["error"], (path, token, status, body)
        for token in (READ, WRITE):
            status, body, _ = await fetch(w, path, token=token)
            assert status in (200, 404) and "bearer token" not in json.dumps(body), (path, token, status, body)
    assert (await fetch(w, "/tasks/no-such-task", token=READ))[1] == {"error": "unknown task_id 'no-such-task'"}
    for path in OPEN_PATHS:
        assert (await fetch(w, path))[0] == 200, path
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://127.0.0.1:{w.web_port}/jobs/{unique('job')}/cancel", json={"by": "ro"},
                                headers={"Authorization": f"Bearer {READ}"}) as r:
            assert r.status == 401, "the read token is no write token"


async def test_a_host_header_naming_another_site_is_refused(cluster_factory):
    """DNS rebinding: a request naming another host is 421 on every data view and the console, even with the
    token; localhost aliases of a loopback bind and AGENTS_STREAM_WEB_ALLOWED_HOSTS names are answered; the probes
    answer any Host; a request without Host is a 400."""
    c = cluster_factory([unique("access")], None, AGENTS_STREAM_API_TOKEN=WRITE,
                        AGENTS_STREAM_WEB_ALLOWED_HOSTS="proxy.internal")
    w = await c.started()
    port = w.web_port
    for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1:{port + 1}", f"localhost.evil.example:{port}"):
        for path in ("/tasks/x", "/approvals", "/circuits", "/"):
            status, body, _ = await fetch(w, path, token=WRITE, host=host)
            assert status == 421 and "does not answer to Host" in body["error"], (host, path, status, body)
        assert (await fetch(w, "/healthz", host=host))[0] == 200, "probes answer any Host"
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "proxy.internal", "proxy.internal:443"):
        status, body, _ = await fetch(w, "/tasks/x", token=WRITE, host=host)
        assert status == 404 and body == {"error": "unknown task_id 'x'"}, (host, status, body)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /tasks/x HTTP/1.0\r\nAuthorization: Bearer {WRITE}\r\n\r\n".encode())
    answer = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    assert answer.startswith(b"HTTP/1.0 400") and b"a Host header naming this worker is required" in answer, answer


async def test_open_mode_is_refused_on_a_non_loopback_bind(cluster_factory):
    """AGENTS_STREAM_API_OPEN=1 with WEB_BIND=0.0.0.0 stops the worker at start, saying why and what to do."""
    c = cluster_factory([unique("access")], None, AGENTS_STREAM_API_OPEN="1", WEB_BIND="0.0.0.0")
    w = c.worker().start()

    async def exited_or_ready() -> str:
        if w.proc.poll() is not None:
            return "exited"
        try:
            return "ready" if (await fetch(w, "/readyz"))[0] == 200 else ""
        except aiohttp.ClientError:
            return ""

    outcome = await eventually(exited_or_ready, timeout=90, what="the worker to exit or to serve")
    assert outcome == "exited" and w.proc.returncode != 0, w.tail()
    assert "AGENTS_STREAM_API_OPEN=1 is refused" in w.tail() and "0.0.0.0" in w.tail(), w.tail()


async def _dead_letters(agent: str, n: int) -> list[str]:
    """``n`` dead letters written straight to the agent's dead-letter topic, oldest first (their task ids)."""
    dlq = topics.dlq_topic(agent)
    await create_topics([dlq])
    ids = [f"{agent}-dead-{i}" for i in range(n)]
    for i, task_id in enumerate(ids):
        headers = [("error_reason", b"permanent_error: seeded"), ("error_layer", b"downstream"),
                   ("failed_at", f"2026-01-01T00:00:{i:02d}Z".encode()), ("attempts", b"1")]
        await produce(dlq, [encode(task(agent, task_id))], headers=headers)
    return ids


async def test_dead_letters_come_a_page_at_a_time_and_reads_are_bounded(cluster_factory):
    """GET /dlq gives `limit` dead letters newest first and a `next` cursor that walks back to the oldest, each
    exactly once, with the topic's size; /dlq/<ref> reads one record; more concurrent reads than
    AGENTS_STREAM_WEB_DLQ_READS are answered 503 with Retry-After, not queued."""
    agent = unique("dlqpage")
    ids = await _dead_letters(agent, 5)
    c = cluster_factory([agent], None, AGENTS_STREAM_WEB_DLQ_READS="1")
    w = await c.started()
    seen: list[str] = []
    pages: list[int] = []
    path = f"/dlq?agent={agent}&limit=2"
    while path:
        body = await w.get(path)
        assert body["total"] == 5 and body["count"] == len(body["dead_letters"]), body
        seen += [d["task_id"] for d in body["dead_letters"]]
        pages.append(body["count"])
        path = f"/dlq?agent={agent}&limit=2&before={body['next']}" if body["next"] else ""
    assert pages == [2, 2, 1] and seen == ids[::-1], (pages, seen)
    first = (await w.get(f"/dlq?agent={agent}&limit=1"))["dead_letters"][0]
    shown = await w.get(f"/dlq/{first['ref']}")
    assert shown["task_id"] == ids[-1] and shown["headers"]["failed_at"] == "2026-01-01T00:00:04Z", shown
    assert (await w.get(f"/dlq?agent={agent}&before=garbage"))["error"].startswith("bad parameter")

    answers = await asyncio.gather(*(fetch(w, f"/dlq?agent={agent}", token=w.env["AGENTS_STREAM_READ_TOKEN"])
                                     for _ in range(8)))
    statuses = sorted(status for status, _, _ in answers)
    assert statuses[0] == 200 and statuses[-1] == 503, statuses
    busy = [(body, headers) for status, body, headers in answers if status == 503]
    assert all(h["Retry-After"] == "2" and "AGENTS_STREAM_WEB_DLQ_READS" in b["error"] for b, h in busy), busy


async def test_approvals_come_a_page_at_a_time(cluster_factory, fake_llm):
    """GET /approvals?limit= gives that many parked tasks, oldest first, the count of all of them, and a `next`
    cursor that reaches every parked task exactly once."""
    agent = unique("apppage")
    policy = (f'[agents.{agent}.approval]\nalways = true\n'
              f'[[agents.{agent}.approval.levels]]\nname = "ops"\ntimeout_s = 600\n')
    c = cluster_factory([agent], fake_llm.url, extra=policy)
    w = await c.started()
    ids = [f"{agent}-{i}" for i in range(5)]
    for task_id in ids:  # one at a time: each parks later than the one before
        await produce(topics.task_topic(agent), [encode(task(agent, task_id))])
        await asyncio.sleep(0.05)

    async def all_parked() -> bool:
        return (await w.get("/approvals"))["count"] == 5

    await eventually(all_parked, timeout=60, what="five parked tasks")
    seen, times, pages, path = [], [], [], "/approvals?limit=2"
    while path:
        body = await w.get(path)
        assert body["count"] == 5 and body["unreachable"] == [], body
        seen += [a["task_id"] for a in body["awaiting"]]
        times += [a["requested_at"] for a in body["awaiting"]]
        pages.append(len(body["awaiting"]))
        path = f"/approvals?limit=2&after={body['next']}" if body["next"] else ""
    assert pages == [2, 2, 1] and sorted(seen) == sorted(ids) and len(set(seen)) == 5, (pages, seen)
    assert times == sorted(times), "oldest first, across pages"
