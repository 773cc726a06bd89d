"""Bounded parking and approvals that say who and where, through real workers: the
per-agent cap, links bound to one parking, signed and unsigned decisions, control characters, the secret's minimum
length, and webhooks paced from a bounded queue (received by a real HTTP server)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import aiohttp

from agents_stream.contract import topics
from agents_stream.ops.notify import Notifier
from agents_stream.testing.fakellm import status

from .harness import (
    BOOTSTRAP,
    PARTITIONS,
    READ_TOKEN,
    ROOT,
    encode,
    eventually,
    produce,
    read_topic,
    results_for,
    task,
    unique,
)
from .test_approvals import Hooks, approval_toml, calls_for, named

TOKEN = "t0ken-for-tests"
SECRET = "approval-secret-for-tests-of-32-characters-or-more"


def same_partition_ids(n: int) -> list[str]:
    """``n`` task ids whose keys land on one partition (the cap is the agent's share of a partition)."""
    first = f"r-{uuid.uuid4().hex[:8]}"
    home = topics.partition_for(first.encode(), PARTITIONS)
    ids = [first]
    while len(ids) < n:
        candidate = f"r-{uuid.uuid4().hex[:8]}"
        if topics.partition_for(candidate.encode(), PARTITIONS) == home:
            ids.append(candidate)
    return ids


def link_fields(url: str) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(url).query))


async def post_link(worker: Any, url: str) -> int:
    """Press a link's confirm button: POST its signed fields to this worker."""
    local = f"http://127.0.0.1:{worker.web_port}{urlsplit(url).path}"
    async with aiohttp.ClientSession() as s:
        async with s.post(local, data=link_fields(url), timeout=aiohttp.ClientTimeout(total=20)) as r:
            return r.status


async def open_link(worker: Any, url: str) -> tuple[int, str]:
    """Open a link's confirmation page on this worker: (status, HTML)."""
    local = f"http://127.0.0.1:{worker.web_port}{urlsplit(url).path}?{urlsplit(url).query}"
    async with aiohttp.ClientSession() as s:
        async with s.get(local, timeout=aiohttp.ClientTimeout(total=20)) as r:
            return r.status, await r.text()


async def control_events(task_id: str, event: str, timeout: float = 60) -> list[dict[str, Any]]:
    """The agent.control events of a task, once one of kind ``event`` is there."""
    msgs = await read_topic(
        topics.CONTROL, timeout=timeout,
        until=lambda seen: any(json.loads(m.value)["event"] == event for m in seen),
        keep=lambda m: m.key is not None and m.key.decode() == task_id,
    )
    return [json.loads(m.value) for m in msgs]


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "KAFKA_BROKER": f"kafka://{BOOTSTRAP}", **env}
    return subprocess.run([sys.executable, "-m", "agents_stream.ops.cli", *args], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=60)


async def test_cap_dead_letters_and_a_requeued_task_gets_new_links_that_alone_decide_it(cluster_factory, fake_llm):
    """The agent's share of a partition parked: the next task is dead-lettered (approval_backlog_full) with a
    failed result. A task approved by its link that then fails is requeued and parked again with new links; the
    old link (signed, unexpired) decides nothing — the ledger says why — and the new one runs it."""
    async with Hooks() as hooks:
        agent = unique("refunds")
        c = cluster_factory([agent], fake_llm.url, toml=approval_toml(agent, fake_llm.url, hooks.url, 300, 300),
                            AGENTS_STREAM_APPROVAL_SECRET=SECRET, AGENTS_STREAM_API_TOKEN=TOKEN,
                            AGENTS_STREAM_APPROVAL_MAX_AWAITING=str(PARTITIONS))  # one per partition
        w = await c.started()
        first_id, over_id = same_partition_ids(2)
        first = task(agent, first_id, instruction="refund order 7", context_data={"amount": 500})
        over = task(agent, over_id, instruction="refund order 8", context_data={"amount": 600})
        fake_llm.enqueue(status(400, body={"error": {"message": "bad request"}}))  # the first run fails for good
        await produce(topics.task_topic(agent), [encode(first)])
        (_, hook), *_ = await eventually(lambda: hooks.for_task(first_id), timeout=30, what="the first webhook")
        await produce(topics.task_topic(agent), [encode(over)])

        got = await results_for({over_id}, timeout=60)
        refused = json.loads(got[over_id][0].value)
        assert (refused["status"], refused["source"]) == ("failed", "approval"), refused
        assert refused["error"].startswith("approval_backlog_full"), refused
        dead = await read_topic(topics.dlq_topic(agent), timeout=30, until=lambda s: len(s) >= 1,
                                keep=lambda m: m.key == over_id.encode())
        headers = dict(dead[0].headers)
        assert headers["error_layer"] == b"approval" and headers["error_reason"].startswith(b"approval_backlog_full")
        assert hooks.for_task(over_id) == [], "a refused task notifies nobody"

        old_link = hook["blocks"][-1]["elements"][0]["url"]
        assert await post_link(w, old_link) == 202
        got = await results_for({first_id}, timeout=60)
        assert json.loads(got[first_id][0].value)["status"] == "failed"
        failed = await read_topic(topics.dlq_topic(agent), timeout=30, until=lambda s: len(s) >= 1,
                                  keep=lambda m: m.key == first_id.encode())
        ref = f"{failed[0].topic}:{failed[0].partition}:{failed[0].offset}"
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://127.0.0.1:{w.web_port}/dlq/requeue", json={"ref": ref},
                              headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                assert r.status == 202, await r.text()

        await eventually(lambda: len(hooks.for_task(first_id)) >= 2, timeout=60, what="the requeued task's webhook")
        new_link = hooks.for_task(first_id)[1][1]["blocks"][-1]["elements"][0]["url"]
        assert link_fields(new_link)["parked"] != link_fields(old_link)["parked"], "a new parking, new links"
        page_status, page = await open_link(w, old_link)  # opening it: the owner of the record says why not
        assert page_status == 409 and "another parking" in page, page
        assert await post_link(w, old_link) == 202  # pressing it anyway: sent, and the ledger ignores it
        events = await control_events(first_id, "approval.ignored")
        ignored = [e for e in events if e["event"] == "approval.ignored"][-1]
        assert "another parking" in ignored["details"]["reason"], ignored
        assert (await w.get(f"/tasks/{first_id}"))["state"] == "awaiting_approval"

        assert await post_link(w, new_link) == 202
        await eventually(lambda: _succeeded(first_id), timeout=60, what="the requeued task run after approval")
        decided = [e for e in await control_events(first_id, "approval.decided") if e["event"] == "approval.decided"]
        assert [d["details"]["signed"] for d in decided] == [True, True] and decided[-1]["details"]["via"] == "link"
        assert calls_for(fake_llm, first_id) == 2 and calls_for(fake_llm, over_id) == 0


async def test_decisions_say_whether_they_were_signed_and_refuse_control_characters(cluster_factory, fake_llm):
    """HTTP and CLI decisions are signed by the worker and the CLI (signed: true); a bare event on
    agent.approvals is applied but recorded as signed: false, in the task's view and in ``tasks show``. Control
    characters in ``by`` or ``comment`` are a 400 over HTTP and an error from the CLI."""
    async with Hooks() as hooks:
        agent = unique("refunds")
        c = cluster_factory([agent], fake_llm.url, toml=approval_toml(agent, fake_llm.url, hooks.url, 300, 300),
                            AGENTS_STREAM_APPROVAL_SECRET=SECRET, AGENTS_STREAM_API_TOKEN=TOKEN)
        w = await c.started()
        via_http, via_event, via_cli = (task(agent, instruction=f"refund {i}", risk_level="critical") for i in range(3))
        await produce(topics.task_topic(agent), [encode(via_http), encode(via_event), encode(via_cli)])
        for t in (via_http, via_event, via_cli):
            await eventually(lambda t=t: _state(w, t["task_id"], "awaiting_approval"), timeout=30, what="parked")

        url = f"http://127.0.0.1:{w.web_port}/approvals/{via_http['task_id']}"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession() as s:
            for body in ({"decision": "approve", "by": "eve\x1b[2J"}, {"decision": "approve", "by": "eve",
                                                                        "comment": "ok\r\nby: admin"}):
                async with s.post(url, json=body, headers=auth) as r:
                    assert r.status == 400 and "control characters" in (await r.json())["error"]
            parked = (await named(w, via_http["task_id"]))["parked"]
            async with s.post(url, json={"decision": "approve", "by": "dave", "parked": parked}, headers=auth) as r:
                assert r.status == 202

        forged = {"task_id": via_event["task_id"], "decision": "approve", "by": "ops@cli", "via": "cli",
                  **await named(w, via_event["task_id"])}
        await produce(topics.APPROVALS, [(via_event["task_id"].encode(), json.dumps(forged).encode())])

        bad = cli("reject", via_cli["task_id"], "--by", "x\x1b]0;owned\x07", AGENTS_STREAM_APPROVAL_SECRET=SECRET)
        assert bad.returncode == 2 and "control characters" in bad.stderr, bad.stderr
        short = cli("reject", via_cli["task_id"], "--by", "carol", AGENTS_STREAM_APPROVAL_SECRET="short")
        assert short.returncode == 2 and "at least 32" in short.stderr, short.stderr
        good = cli("reject", via_cli["task_id"], "--by", "carol", "--parked",
                   str((await named(w, via_cli["task_id"]))["parked"]), AGENTS_STREAM_APPROVAL_SECRET=SECRET,
                   WEB_PORT=str(w.web_port), WEB_HOST="127.0.0.1", AGENTS_STREAM_READ_TOKEN=READ_TOKEN)
        assert good.returncode == 0 and "signed" in good.stdout, good.stderr

        signed_of = {}
        for t, final in ((via_http, "succeeded"), (via_event, "succeeded"), (via_cli, "rejected")):
            await eventually(lambda t=t, final=final: _state(w, t["task_id"], final), timeout=60, what=final)
            signed_of[t["task_id"]] = (await w.get(f"/tasks/{t['task_id']}"))["approval"]["decision"]["signed"]
        assert signed_of == {via_http["task_id"]: True, via_event["task_id"]: False, via_cli["task_id"]: True}
        shown = cli("tasks", "show", via_event["task_id"], WEB_PORT=str(w.web_port), WEB_HOST="127.0.0.1",
                    AGENTS_STREAM_READ_TOKEN=READ_TOKEN)
        assert shown.returncode == 0 and "UNSIGNED" in shown.stdout, shown.stdout + shown.stderr
        events = await control_events(via_event["task_id"], "approval.decided")
        assert [e["details"]["signed"] for e in events if e["event"] == "approval.decided"] == [False]


async def test_a_worker_refuses_to_start_with_a_short_approval_secret(cluster_factory):
    """A short HMAC key makes links guessable: the worker exits at start and says how long it must be."""
    c = cluster_factory([unique("refunds")], None, AGENTS_STREAM_APPROVAL_SECRET="link-secret")
    w = c.worker().start()
    assert w.proc is not None
    code = await asyncio.to_thread(w.proc.wait, 90)
    assert code != 0
    log = w.tail()
    assert "AGENTS_STREAM_APPROVAL_SECRET has 11 characters; it needs at least 32" in log, log
    assert "link-secret" not in log, "the secret itself is never logged"


async def test_webhooks_are_paced_and_a_full_queue_drops_with_a_warning(caplog):
    """At most rate_per_s posts start per second; notifications beyond the queue's bound are dropped (counted,
    logged once), and the queued ones all arrive at the receiving server."""
    async with Hooks() as hooks:
        notifier = Notifier(rate_per_s=10.0, queue_max=5, timeout_s=5.0)
        await notifier.start()
        try:
            for i in range(20):
                notifier.notify(f"{hooks.url}/hook/lead", {"task_id": f"t{i}", "text": "x"}, subject=f"task t{i}")
            assert notifier.dropped == 15
            arrivals: list[float] = []
            started = time.monotonic()
            await eventually(lambda: _arrived(hooks, arrivals), timeout=30, interval=0.01, what="five webhooks")
            assert [b["task_id"] for _, b in hooks.received] == [f"t{i}" for i in range(5)], "the first five, in order"
            assert arrivals[-1] - started >= 0.35, f"five posts at 10/s take at least 0.4 s: {arrivals}"
            await asyncio.sleep(0.5)
            assert len(hooks.received) == 5
        finally:
            await notifier.stop()
    warnings = [r for r in caplog.records if "webhook queue is full" in r.getMessage()]
    assert len(warnings) == 1, "one line per 10 s, however many are dropped"


def _arrived(hooks: Hooks, arrivals: list[float]) -> bool:
    while len(arrivals) < len(hooks.received):
        arrivals.append(time.monotonic())
    return len(hooks.received) >= 5


async def _succeeded(task_id: str) -> bool:
    got = await results_for({task_id}, timeout=5)
    return any(json.loads(m.value)["status"] == "succeeded" for m in got.get(task_id, []))


async def _state(worker: Any, task_id: str, state: str) -> bool:
    try:
        return (await worker.get(f"/tasks/{task_id}")).get("state") == state
    except Exception:
        return False


async def test_a_requeue_sends_only_to_the_agents_own_task_topic(cluster_factory, fake_llm):
    """A record planted on an agent's dead-letter topic whose original_topic header names agent.approvals is
    requeued to the agent's task topic (and runs there), never onto the approvals topic."""
    agent = unique("refunds")
    c = cluster_factory([agent], fake_llm.url, AGENTS_STREAM_API_TOKEN=TOKEN)
    w = await c.started()
    planted_task = task(agent, instruction="summarise 1")
    key, value = encode(planted_task)
    await produce(topics.dlq_topic(agent), [(key, value)], headers=[
        ("error_reason", b"forged"), ("error_layer", b"schema"), ("original_topic", topics.APPROVALS.encode()),
        ("original_partition", b"0"), ("original_offset", b"0"), ("attempts", b"1"),
    ])
    planted = await read_topic(topics.dlq_topic(agent), timeout=30, until=lambda s: len(s) >= 1,
                               keep=lambda m: m.key == key)
    ref = f"{planted[0].topic}:{planted[0].partition}:{planted[0].offset}"
    async with aiohttp.ClientSession() as s:
        async with s.post(f"http://127.0.0.1:{w.web_port}/dlq/requeue", json={"ref": ref},
                          headers={"Authorization": f"Bearer {TOKEN}"}) as r:
            assert r.status == 202, await r.text()
    on_approvals = await read_topic(topics.APPROVALS, timeout=5, until=lambda s: False, keep=lambda m: m.key == key)
    assert on_approvals == [], "nothing reached agent.approvals"
    got = await results_for({planted_task["task_id"]}, timeout=60)
    assert json.loads(got[planted_task["task_id"]][0].value)["status"] == "succeeded", "requeued to its task topic"
    async with aiohttp.ClientSession() as s:
        bad_ref = f"{topics.dlq_of(topics.APPROVALS)}:0:0"
        async with s.post(f"http://127.0.0.1:{w.web_port}/dlq/requeue", json={"ref": bad_ref},
                          headers={"Authorization": f"Bearer {TOKEN}"}) as r:
            assert r.status == 400, await r.text()
