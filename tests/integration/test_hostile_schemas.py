"""A real worker given hostile task schemas: nothing fetched, no freeze, every other task still answered."""

from __future__ import annotations

import json
import time

from agents_stream.contract import topics
from agents_stream.testing.fakellm import FakeLLM, ok
from agents_stream.testing.silent import SilentServer

from .harness import encode, produce, read_topic, results_for, task, unique
from .test_resilience import agent_toml, decoded, provider

ANSWER = json.dumps({"n": "a" * 40 + "!"})


def _pattern(p: str) -> dict[str, object]:
    return {"type": "object", "properties": {"n": {"type": "string", "pattern": p}}}


async def test_hostile_schemas_fail_their_tasks_and_the_worker_answers_the_rest(cluster_factory) -> None:
    """A remote $ref and two backtracking patterns against 40 a's and a "!" each fail their own task with a reason
    (dead-lettered); no connection reaches the $ref's server and the tasks after them are answered."""
    with SilentServer(hold_s=30).running() as server:
        async with FakeLLM(default=ok(ANSWER)) as fake:
            agent = unique("hostile")
            toml = provider("fake", fake) + agent_toml(agent, providers=["fake"], format_retries=0)
            c = cluster_factory([agent], None, toml=toml)
            await c.started()
            hostile = {
                "invalid_output_schema": task(agent, output_schema={"$ref": server.url}),
                "invalid_output: $.n": task(agent, output_schema=_pattern("^(a+)+$")),  # days on Python's re
                "output_check_aborted: pattern": task(agent, output_schema=_pattern("^(a|aa)+$")),
            }
            plain = [task(agent, n=i) for i in range(5)]
            started = time.monotonic()
            await produce(topics.task_topic(agent), [encode(t) for t in [*hostile.values(), *plain]])
            ids = {t["task_id"] for t in [*hostile.values(), *plain]}
            results = decoded(await results_for(ids, timeout=90))
            took = time.monotonic() - started
            unanswered = [t["instruction"] if t in plain else t["output_schema"]
                          for t in [*hostile.values(), *plain] if t["task_id"] not in results]
            assert not unanswered, f"no result within 90 s for {unanswered}"
            dlq = await read_topic(topics.dlq_topic(agent), timeout=30, until=lambda s: len(s) >= 3)
    for t in plain:
        assert results[t["task_id"]]["status"] == "succeeded" and results[t["task_id"]]["output"] == ANSWER
    reasons = {json.loads(m.value)["task_id"]: dict(m.headers)["error_reason"].decode() for m in dlq}
    for reason, t in hostile.items():
        assert results[t["task_id"]]["status"] == "failed", results[t["task_id"]]
        assert reasons[t["task_id"]].startswith(reason), reasons[t["task_id"]]
    assert server.connections == 0, "a task's $ref reached the server it names"
    print(f"\nhostile schemas: 3 failed with their reasons, 5 plain answered, {took:.1f}s, 0 connections")
