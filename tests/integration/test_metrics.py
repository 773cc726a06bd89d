"""/metrics on a real worker and broker: each outcome counted once, dead letters by layer, retries, in-flight, lag."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from agents_stream.contract import topics
from agents_stream.contract.models import ApprovalDecision
from agents_stream.testing.fakellm import ok, status

from .harness import encode, eventually, produce, read_topic, results_for, task, unique

N_OK = 6


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of the exposition, keyed by name and labels (parsed the way Prometheus reads it)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: dict[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    """The sum over every series of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


async def test_metrics_count_each_outcome_once_and_return_to_zero(cluster_factory, fake_llm):
    """Succeeded, failed and rejected tasks are counted exactly once (a redelivered finished task adds nothing), dead
    letters by layer match what was caused, a 503 is one retry; a slow call shows as in flight, leased and lagging,
    a parked task as a pending approval; at the end in-flight, leases, approvals and lag are back to 0."""
    agent, gate = unique("metrics"), unique("gate")
    policy = (
        f'[agents.{gate}.approval]\nalways = true\n[[agents.{gate}.approval.levels]]\nname = "lead"\ntimeout_s = 600\n'
    )
    c = cluster_factory([agent, gate], fake_llm.url, extra=policy)
    w = await c.started()
    tasks_topic = topics.task_topic(agent)

    async def scrape() -> dict[tuple[str, frozenset], float]:
        text = await w.get("/metrics")
        assert isinstance(text, str), text
        return parse(text)

    # Layer 2, the task's own fault: two 400s → two failed results and two downstream dead letters.
    fake_llm.enqueue(status(400), status(400))
    await produce(tasks_topic, [encode(task(agent, n=i)) for i in range(2)])
    await read_topic(topics.dlq_topic(agent), until=lambda seen: len(seen) >= 2, timeout=60)

    # A 503 then an answer: one retry, reason server_error, and a success.
    fake_llm.enqueue(status(503))
    flaky = task(agent, n=100)
    await produce(tasks_topic, [encode(flaky)])
    await results_for({flaky["task_id"]}, timeout=60)

    # A slow answer: while it runs the call is in flight, the task is leased and its offset is lag.
    fake_llm.enqueue(ok(latency=8.0))
    slow = task(agent, n=101)
    await produce(tasks_topic, [encode(slow)])

    async def running() -> Any:
        m = await scrape()
        busy = (
            value(m, "agents_stream_provider_calls_in_flight", provider="fake") == 1
            and value(m, "agents_stream_leases_held") == 1
            and value(m, "agents_stream_consumer_lag_messages", topic=tasks_topic) >= 1
        )
        return m if busy else None

    await eventually(running, timeout=7, interval=0.2, what="the slow call in flight, leased and lagging")
    await results_for({slow["task_id"]}, timeout=60)

    # N_OK ordinary tasks among three layer-1 poison messages.
    good = [task(agent, n=i) for i in range(N_OK)]
    poison = [(b"poison-null", None), (b"poison-json", b"{not json"),
              (b"poison-schema", json.dumps({"task_id": "p", "agent_name": 1}).encode())]
    await produce(tasks_topic, [encode(g) for g in good] + poison)
    await results_for({g["task_id"] for g in good}, timeout=60)
    await read_topic(topics.dlq_topic(agent), until=lambda seen: len(seen) >= 5, timeout=60)

    # A finished task delivered again: its stored result goes out again; nothing is counted.
    await produce(tasks_topic, [encode(good[0])])
    await read_topic(topics.RESULTS, until=lambda seen: len(seen) >= 2, timeout=60,
                     keep=lambda m: m.key == good[0]["task_id"].encode())

    # A task parked for approval is pending until a human rejects it.
    parked = task(gate)
    await produce(topics.task_topic(gate), [encode(parked)])

    async def pending() -> bool:
        return value(await scrape(), "agents_stream_approvals_pending", agent=gate) == 1

    await eventually(pending, timeout=30, what="one approval pending")
    view = await w.get(f"/tasks/{parked['task_id']}")  # a decision names the app id, agent and parking it decides
    decision = ApprovalDecision(task_id=parked["task_id"], decision="reject", by="metrics-test", app_id=view["app_id"],
                                agent=view["agent"], parked=view["approval"]["parked"])
    await produce(topics.APPROVALS, [(parked["task_id"].encode(), decision.model_dump_json().encode())])
    rejected = await results_for({parked["task_id"]}, timeout=60)
    assert json.loads(rejected[parked["task_id"]][0].value)["status"] == "failed"

    async def final() -> Any:
        m = await scrape()
        quiet = (
            value(m, "agents_stream_tasks_total", agent=agent, outcome="succeeded") == N_OK + 2
            and value(m, "agents_stream_tasks_total", agent=gate, outcome="rejected") == 1
            and value(m, "agents_stream_approvals_pending", agent=gate) == 0
            and value(m, "agents_stream_consumer_lag_messages", topic=tasks_topic) == 0
            and value(m, "agents_stream_consumer_lag_messages", topic=topics.task_topic(gate)) == 0
            and value(m, "agents_stream_consumer_lag_messages", topic=topics.outcomes_topic(c.app_id)) == 0
            and value(m, "agents_stream_leases_held") == 0
        )
        return m if quiet else None

    m = await eventually(final, timeout=30, what="every count final and every gauge back to 0")
    assert {o: value(m, "agents_stream_tasks_total", agent=agent, outcome=o)
            for o in ("succeeded", "failed", "dead_lettered", "rejected")} == {
        "succeeded": N_OK + 2, "failed": 2, "dead_lettered": 0, "rejected": 0,
    }
    assert {o: value(m, "agents_stream_tasks_total", agent=gate, outcome=o)
            for o in ("succeeded", "failed", "dead_lettered", "rejected")} == {
        "succeeded": 0, "failed": 0, "dead_lettered": 0, "rejected": 1,
    }
    assert value(m, "agents_stream_dead_letters_total", agent=agent, layer="downstream") == 2
    assert value(m, "agents_stream_dead_letters_total", agent=agent, layer="schema") == 3
    assert value(m, "agents_stream_dead_letters_total", agent=agent, layer="recovery") == 0
    assert total(m, "agents_stream_dead_letters_total", agent=gate) == 0, "a rejection is no dead letter"
    assert total(m, "agents_stream_provider_retries_total", provider="fake") == 1
    assert value(m, "agents_stream_provider_retries_total", provider="fake", reason="server_error") == 1

    calls = total(m, "agents_stream_provider_calls_total", provider="fake")
    assert calls == len(fake_llm.requests) >= N_OK + 5, (
        "2 rejected, 1 failed, N_OK + 2 answered; the parked task made none"
    )
    assert value(m, "agents_stream_provider_calls_total", provider="fake", outcome="rejected") == 2
    assert value(m, "agents_stream_provider_calls_total", provider="fake", outcome="failure") == 1
    assert value(m, "agents_stream_provider_call_seconds_count", provider="fake") == calls
    assert value(m, "agents_stream_provider_calls_in_flight", provider="fake") == 0
    assert value(m, "agents_stream_tasks_held") == 0
    assert all(v >= 0 for (n, _), v in m.items() if n == "agents_stream_consumer_lag_messages")
    print(
        f"\nmetrics: succeeded={N_OK + 2} failed=2 rejected=1 dead letters downstream=2 schema=3; "
        f"provider calls={calls:.0f}, retries=1; in-flight, leases, approvals pending and lag back to 0"
    )
