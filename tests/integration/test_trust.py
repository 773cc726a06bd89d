"""A producer cannot steer a worker through a task's ``parent``, on the real broker (docs/security.md, "A task's
parent"): a parent naming an app id whose outcomes topic cannot exist is dead-lettered and the worker goes on
answering; a forged sub-task naming a victim's call does not answer that call; a sub-task's result too large for
its caller's record ends the caller failed instead of leaving it waiting."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents_stream.contract import topics
from agents_stream.testing.fakellm import FakeLLM, call, ok, tool_calls

from .harness import encode, eventually, produce, read_topic, results_for, task, unique
from .test_agents import providers_toml, turns_asked


def _headers(msg: Any) -> dict[str, str]:
    return {k: v.decode() for k, v in msg.headers}


async def test_a_parent_naming_an_invalid_app_is_dead_lettered_and_the_next_tasks_are_answered(cluster_factory):
    """Two hostile tasks: one whose parent does not match its own task id, one whose parent's app id is no topic
    name. Each has one dead letter saying why (layer schema); the plain tasks after them are answered."""
    agent = unique("analyzer")
    c = cluster_factory([agent], None)
    await c.started()
    mismatch = task(agent, task_id=unique("x1"), parent={"task_id": "x", "app_id": "no such app!", "call_id": "c1"})
    parent_id = unique("x")
    invalid = task(agent, task_id=f"{parent_id}/c1",
                   parent={"task_id": parent_id, "app_id": "no such app!", "call_id": "c1"})
    plain = [task(agent, n=i) for i in range(3)]
    await produce(topics.task_topic(agent), [encode(mismatch), encode(invalid), encode(plain[0])])
    got = await results_for({plain[0]["task_id"]}, timeout=60)
    await produce(topics.task_topic(agent), [encode(t) for t in plain[1:]])
    got.update(await results_for({t["task_id"] for t in plain[1:]}, timeout=60))
    assert all(json.loads(got[t["task_id"]][0].value)["status"] == "succeeded" for t in plain)
    dlq = await read_topic(topics.dlq_topic(agent), until=lambda s: len(s) >= 2, timeout=30)
    by_key = {m.key.decode(): _headers(m) for m in dlq}
    assert len(dlq) == 2 and set(by_key) == {mismatch["task_id"], invalid["task_id"]}
    assert all(h["error_layer"] == "schema" for h in by_key.values())
    assert by_key[mismatch["task_id"]]["error_reason"].startswith("parent_mismatch"), by_key
    assert "x/c1" in by_key[mismatch["task_id"]]["error_reason"], "the reason names the id a sub-task must have"
    assert by_key[invalid["task_id"]]["error_reason"].startswith("schema_violation"), by_key
    assert "parent.app_id" in by_key[invalid["task_id"]]["error_reason"]
    early = await read_topic("agent.results", until=lambda s: False, timeout=2,
                             keep=lambda m: m.key in (mismatch["task_id"].encode(), invalid["task_id"].encode()))
    assert early == [], "a dead-lettered task is not run"
    assert "is not a valid topic name" not in c.workers[0].tail(2000)
