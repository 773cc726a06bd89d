"""`agents-stream dlq list / show / requeue` against the real broker and a real worker."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

from agents_stream.contract import topics
from agents_stream.testing.fakellm import status

from .harness import ROOT, encode, produce, read_topic, task, unique


async def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "agents_stream.ops.cli", "dlq", *args],
        env=env, capture_output=True, text=True, timeout=120, cwd=ROOT,
    )


async def results_of(task_id: str, count: int) -> list[dict[str, Any]]:
    msgs = await read_topic(
        topics.RESULTS, timeout=60, until=lambda seen: len(seen) >= count, keep=lambda m: m.key == task_id.encode(),
    )
    return [json.loads(m.value) for m in msgs]


async def dead_letters(agent: str, count: int) -> list[Any]:
    return await read_topic(topics.dlq_topic(agent), timeout=60, until=lambda seen: len(seen) >= count)


async def test_requeue_brings_a_dead_letter_back_to_a_result(cluster_factory, fake_llm):
    """A task dead-lettered by a 400 is listed, shown and requeued; it runs again (attempts reset) and succeeds."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url)
    w = await c.started()
    fake_llm.enqueue(status(400))
    t = task(agent)
    await produce(topics.task_topic(agent), [encode(t)])
    assert (await results_of(t["task_id"], 1))[0]["status"] == "failed"
    await dead_letters(agent, 1)

    listed = await cli(w.env, "list", "--agent", agent, "--layer", "downstream", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [r["task_id"] for r in rows] == [t["task_id"]]
    ref = rows[0]["ref"]
    none = await cli(w.env, "list", "--agent", agent, "--layer", "schema", "--json")
    assert none.stdout.strip() == "", "filters exclude what does not match"
    shown = json.loads((await cli(w.env, "show", ref)).stdout)
    assert shown["headers"]["error_reason"].startswith("permanent_error") and shown["value"] == t

    requeued = await cli(w.env, "requeue", ref)
    assert requeued.returncode == 0 and f"requeued {ref}" in requeued.stdout, requeued.stderr
    results = await results_of(t["task_id"], 2)
    assert [r["status"] for r in results] == ["failed", "succeeded"]
    assert results[1]["attempts"] == 1, "the attempt counter starts again"
    assert len([r for r in fake_llm.requests if r.task_id == t["task_id"]]) == 2


async def test_a_requeued_task_that_fails_again_comes_back_with_its_history(cluster_factory, fake_llm):
    """Failing again after a requeue gives a new dead letter with its attempts, the requeue count
    and the earlier failure's headers."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url)
    w = await c.started()
    fake_llm.enqueue(status(400), status(400))
    t = task(agent)
    await produce(topics.task_topic(agent), [encode(t)])
    first = (await dead_letters(agent, 1))[0]
    bad = await cli(w.env, "requeue", "agent.tasks.nope:0:1")
    assert bad.returncode == 2 and "dead-letter reference" in bad.stderr
    requeued = await cli(w.env, "requeue", "--all", "--agent", agent, "--reason", "permanent")
    assert requeued.returncode == 0, requeued.stderr
    second = (await dead_letters(agent, 2))[1]
    headers = {k: v.decode() for k, v in second.headers}
    history = json.loads(headers["agents_stream.history"])
    assert headers["attempts"] == "1" and headers["agents_stream.requeues"] == "1"
    assert history[0]["error_reason"] == dict((k, v.decode()) for k, v in first.headers)["error_reason"]
    assert history[0]["dead_letter"].endswith(f":{first.partition}:{first.offset}")
    assert second.value == first.value == encode(t)[1], "the original bytes, unchanged"
    print(
        f"\nrequeued task failed again: DLQ attempts={headers['attempts']} "
        f"requeues={headers['agents_stream.requeues']} history={len(history)}"
    )
