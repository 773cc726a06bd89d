"""Web reads on the real broker: any worker answers for any key, routed to the key's owner."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import quote

import aiohttp

from agents_stream.contract import topics
from agents_stream.testing.fakellm import status

from .harness import encode, eventually, produce, read_topic, results_for, task, unique


async def test_any_worker_answers_for_any_task(cluster_factory):
    """With two workers, /tasks/<id> gives the record from either one (Faust's table_route hashes the JSON-encoded
    key and sent about half of these to a worker without the key); unknown ids are 404 on both. A decision is
    checked where the task is: the worker without it forwards the owner's answer (409: the task ended)."""
    agent = unique("web")
    c = cluster_factory([agent], None, AGENTS_STREAM_API_TOKEN=TOKEN)
    workers = [await c.started("w0"), await c.started("w1")]
    run = unique("r")  # ids of their own: agent.results keeps earlier runs' results under the same keys
    ids = [f"{run}-job{i}/step" for i in range(8)] + [f"{run}-plain-{i}" for i in range(8)]
    await produce(topics.task_topic(agent), [encode(task(agent, i)) for i in ids])
    await results_for(set(ids), timeout=60)
    owners = set()
    for task_id in ids:
        for w in workers:
            body = await w.get(f"/tasks/{quote(task_id, safe='')}")
            assert isinstance(body, dict) and body.get("task_id") == task_id and body["state"] == "succeeded", (
                w.name, task_id, body)
            owners.add(body["owner"])
    assert len(owners) == 2, "both workers own some of the tasks, so half the reads were forwarded"
    for task_id in ids[:4]:
        for w in workers:
            decided = await post(w, f"/approvals/{quote(task_id, safe='')}", {"decision": "approve", "by": "ops",
                                                                            "parked": 1})
            assert decided == (409, {"error": "the task is succeeded: it was decided before, or timed out",
                                     "task_id": task_id}), (w.name, task_id, decided)
    views = [await w.get("/circuits") for w in workers]
    assert (
        set(views[0]["providers"]) == set(views[1]["providers"]) == {"local"}
        and views[0]["worker"] != views[1]["worker"]
    )
    for w in workers:
        body = await w.get("/tasks/no-such-task")
        assert body == {"error": "unknown task_id 'no-such-task'"}


TOKEN = "web-test-token"


async def post(w, path: str, body: Any, *, token: str | None = TOKEN, **headers: str) -> tuple[int, Any]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers.setdefault("Content-Type", "application/json")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://127.0.0.1:{w.web_port}{path}", data=raw, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=30)) as r:
            return r.status, await r.json()


async def test_dead_letters_are_listed_shown_and_requeued_over_http_and_mutations_are_guarded(
    cluster_factory, fake_llm
):
    """/dlq lists a dead letter with its layer and reason, /dlq/<ref> shows it, POST /dlq/requeue brings it back to a
    result; a requeue without the token, from another origin, not as JSON or too large is refused and sends nothing."""
    agent = unique("webdlq")
    c = cluster_factory([agent], fake_llm.url, AGENTS_STREAM_API_TOKEN=TOKEN)
    w = await c.started()
    fake_llm.enqueue(status(400))
    t = task(agent)
    await produce(topics.task_topic(agent), [encode(t)])
    await read_topic(topics.dlq_topic(agent), timeout=60, until=lambda seen: len(seen) >= 1)

    listed = await w.get(f"/dlq?agent={agent}")
    assert listed["count"] == 1, listed
    row = listed["dead_letters"][0]
    assert row["task_id"] == t["task_id"] and row["agent"] == agent and row["error_layer"] == "downstream"
    assert row["reason"].startswith("permanent_error") and row["attempts"] == 1 and row["requeues"] == 0
    assert (await w.get(f"/dlq?agent={agent}&layer=schema"))["count"] == 0, "filters exclude what does not match"
    shown = await w.get(f"/dlq/{row['ref']}")
    assert shown["value"] == t and shown["headers"]["original_topic"] == topics.task_topic(agent)
    assert "error" in await w.get(f"/dlq/{topics.dlq_topic(agent)}:0:999999")

    ref = {"ref": row["ref"]}
    assert (await post(w, "/dlq/requeue", ref, token=None))[0] == 401
    assert (await post(w, "/dlq/requeue", ref, token="wrong"))[0] == 401
    assert (await post(w, "/dlq/requeue", ref, Origin="http://evil.example"))[0] == 403
    assert (await post(w, "/dlq/requeue", json.dumps(ref).encode(), **{"Content-Type": "text/plain"}))[0] == 415
    assert (await post(w, "/dlq/requeue", {"ref": row["ref"], "pad": "x" * 70_000}))[0] == 413
    assert (await post(w, "/dlq/requeue", {"ref": "not-a-ref"}))[0] == 400
    status_code, body = await post(w, "/dlq/requeue",
                                   {"topic": row["topic"], "partition": row["partition"], "offset": row["offset"]},
                                   Origin=f"http://127.0.0.1:{w.web_port}")
    assert status_code == 202 and body["requeued"]["task_id"] == t["task_id"], body
    results = await read_topic(topics.RESULTS, timeout=60, until=lambda seen: len(seen) >= 2,
                               keep=lambda m: m.key == t["task_id"].encode())
    assert [json.loads(m.value)["status"] for m in results] == ["failed", "succeeded"], "one requeue, one new run"
    await asyncio.sleep(2)
    assert (await w.get(f"/dlq?agent={agent}"))["count"] == 1, "the refused requeues sent nothing"


async def test_cancel_over_http_becomes_a_job_event(cluster_factory):
    """POST /jobs/<id>/cancel needs the token and publishes a cancel JobRequest on agent.jobs for the orchestrator."""
    c = cluster_factory([unique("webjobs")], None, AGENTS_STREAM_API_TOKEN=TOKEN)
    w = await c.started()
    health = await w.get("/healthz")
    assert health["status"] == "ok" and health["worker"] == (await w.readyz())["worker"]
    job_id = unique("job")
    assert (await post(w, f"/jobs/{job_id}/cancel", {"by": "ops"}, token=None))[0] == 401
    status_code, body = await post(w, f"/jobs/{job_id}/cancel", {"by": "ops", "reason": "wrong input"})
    assert status_code == 202 and body == {"accepted": True, "job_id": job_id, "by": "ops"}
    sent = await read_topic(topics.JOBS, timeout=30, until=lambda seen: len(seen) >= 1,
                            keep=lambda m: m.key == job_id.encode())
    assert len(sent) == 1, "the refused call sent nothing"
    event = json.loads(sent[0].value)
    assert (event["job_id"], event["action"], event["by"], event["reason"]) == (job_id, "cancel", "ops", "wrong input")


async def test_any_worker_lists_every_workers_approvals(cluster_factory, fake_llm):
    """Tasks parked for approval on two workers' partitions are all listed by /approvals on either worker."""
    agent = unique("webgate")
    policy = (
        f'[agents.{agent}.approval]\nalways = true\n'
        f'[[agents.{agent}.approval.levels]]\nname = "lead"\ntimeout_s = 600\n'
    )
    c = cluster_factory([agent], fake_llm.url, extra=policy)
    workers = [await c.started("w0"), await c.started("w1")]
    ids = {f"{agent}-{i}" for i in range(12)}
    await produce(topics.task_topic(agent), [encode(task(agent, i)) for i in ids])

    async def listed(w) -> bool:
        return {a["task_id"] for a in (await w.get("/approvals"))["awaiting"]} == ids

    for w in workers:
        await eventually(lambda w=w: listed(w), timeout=60, what=f"every parked task listed by {w.name}")
    local = []
    async with aiohttp.ClientSession() as session:
        for w in workers:  # what each worker holds itself (the header marks a request already gathered)
            async with session.get(f"http://127.0.0.1:{w.web_port}/approvals",
                                   headers={"X-Agents-Stream-Routed": "1", **w.read_headers()}) as r:
                local.append({a["task_id"] for a in (await r.json())["awaiting"]})
    assert all(local) and local[0] | local[1] == ids and not local[0] & local[1], (
        "both workers hold some of the parked tasks"
    )
    assert not [r for r in fake_llm.requests if r.task_id in ids], "nothing parked reached the provider"


async def test_a_conversation_is_deleted_through_the_worker_that_does_not_own_it(cluster_factory):
    """A delete names the conversation's agent, read where the conversation is: asked of the other worker, that
    worker asks the owner (routing.ask_owner, with the caller's token) and sends the delete; an unknown
    conversation is 404 from both workers."""
    from agents_stream.client import Client

    agent = unique("web")
    c = cluster_factory([agent], None, AGENTS_STREAM_API_TOKEN=TOKEN)
    workers = [await c.started("w0"), await c.started("w1")]
    by_id = {(await w.get("/healthz"))["worker"]: w for w in workers}
    async with Client(f"http://127.0.0.1:{workers[0].web_port}", TOKEN) as client:
        cids = [unique("conv") for _ in range(4)]
        sent = [await client.send(cid, agent, "hello") for cid in cids]
        rounds = [(await client.reply(cid, s.message_id, timeout=60))["task_id"] for cid, s in zip(cids, sent,
                                                                                                  strict=True)]
        for cid, round_id in zip(cids, rounds, strict=True):
            owner = (await workers[0].get(f"/tasks/{quote(round_id, safe='')}"))["owner"]
            (other,) = [w for worker_id, w in by_id.items() if worker_id != owner]
            assert await post(other, f"/conversations/{quote(cid, safe='')}/delete", {"by": "web-test"}) == (
                202, {"accepted": True, "conversation_id": cid, "by": "web-test"})
            await eventually(lambda cid=cid: _gone(client, cid), timeout=30, what=f"{cid} deleted")
    for w in workers:
        status_code, body = await post(w, f"/conversations/{unique('none')}/delete", {"by": "web-test"})
        assert status_code == 404 and "unknown conversation_id" in body["error"], body


async def _gone(client: Any, cid: str) -> bool:
    return await client.conversation(cid) is None
