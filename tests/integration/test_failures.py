"""Provider outages, crashes, shutdowns, broker restarts and rebalances on the real broker.

Each test here also stands for one of docs/faust.md's "where messages get
lost" cases (named in its docstring) and shows it cannot happen here.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections import Counter

import pytest

from agents_stream.contract import topics
from agents_stream.ledger.poison import poison_key
from agents_stream.testing.fakellm import status

from .harness import (
    BOOTSTRAP,
    PARTITIONS,
    ROOT,
    committed,
    create_topics,
    encode,
    eventually,
    produce,
    read_topic,
    results_for,
    task,
    unique,
)


def calls_per_task(fake, ids: set[str]) -> Counter:
    return Counter(r.task_id for r in fake.requests if r.task_id in ids)


def group_lag(group: str, topic: str) -> int:
    """Total LAG of ``topic`` as Kafka's own kafka-consumer-groups tool reports it."""
    out = subprocess.run(
        [str(ROOT / "scripts" / "kafka-tool"), "consumer-groups", "--bootstrap-server", BOOTSTRAP, "--describe",
         "--group", group],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    lag = 0
    for line in out.splitlines():
        cols = line.split()
        if len(cols) >= 6 and cols[1] == topic and cols[5].isdigit():
            lag += int(cols[5])
    return lag


def assert_one_distinct_success(results: dict, ids: set[str]) -> None:
    assert set(results) == ids, f"missing results for {sorted(ids - set(results))[:5]}"
    for task_id, msgs in results.items():
        assert len({m.value for m in msgs}) == 1, f"{task_id} has conflicting results"
        assert json.loads(msgs[0].value)["status"] == "succeeded"


async def test_transient_failures_are_retried_with_growing_delays(cluster_factory, fake_llm):
    """A flaky provider (breaker never reached) is retried with exponential backoff, and the task then succeeds."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url, extra="[breaker]\nfailure_threshold = 100\n",
                        AGENTS_STREAM_MAX_RETRIES="4")
    await c.started()
    fake_llm.enqueue(*[status(503)] * 4)
    t = task(agent)
    await produce(topics.task_topic(agent), [encode(t)])
    results = await results_for({t["task_id"]}, timeout=60)
    assert_one_distinct_success(results, {t["task_id"]})
    stamps = [r.ts for r in fake_llm.requests if r.task_id == t["task_id"]]
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    print(f"\nretry gaps: {[round(g, 2) for g in gaps]}")
    assert len(stamps) == 5, "four 503s, then the answer"
    assert gaps[3] > gaps[0], gaps


async def test_provider_outage_holds_tasks_as_lag_and_they_resume_by_themselves(cluster_factory, fake_llm):
    """All providers down: the breaker opens → tasks held (no DLQ, no failed result), lag visible;
    provider back → all complete."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url, extra="[breaker]\nopen_timeout_s = 3\n", AGENTS_STREAM_MAX_RETRIES="3")
    w = await c.started()
    await fake_llm.set_mode(outage=True)
    ts = [task(agent, n=i) for i in range(5)]
    ids = {t["task_id"] for t in ts}
    await produce(topics.task_topic(agent), [encode(t) for t in ts])

    held = await read_topic(
        topics.CONTROL, timeout=60,
        until=lambda seen: {json.loads(m.value)["subject"] for m in seen} >= ids,
        keep=lambda m: json.loads(m.value)["event"] == "task.held" and json.loads(m.value)["subject"] in ids,
    )
    assert {json.loads(m.value)["subject"] for m in held} == ids
    ready = await w.readyz()
    assert ready["providers_down"] == ["fake"]
    await asyncio.sleep(3)  # a few commit intervals: nothing may be committed past the held tasks
    lag = await asyncio.to_thread(group_lag, c.app_id, topics.task_topic(agent))
    print(f"\nall providers down: lag while held = {lag} (kafka-consumer-groups)")
    assert lag == len(ts)
    early = await read_topic("agent.results", until=lambda s: False, timeout=2,
                             keep=lambda m: m.key and m.key.decode() in ids)
    assert early == [], "no result (failed or otherwise) while held"
    dlq = await read_topic(topics.dlq_topic(agent), until=lambda s: False, timeout=2)
    assert dlq == [], "held tasks are never dead-lettered"

    await fake_llm.set_mode(outage=False)
    results = await results_for(ids, timeout=60)
    assert_one_distinct_success(results, ids)
    await eventually(lambda: _lag_zero(c.app_id, agent), timeout=30, what="lag back to 0")


async def _lag_zero(group: str, agent: str) -> bool:
    return await asyncio.to_thread(group_lag, group, topics.task_topic(agent)) == 0


async def test_sigkill_with_calls_in_flight_loses_nothing(cluster_factory, fake_llm):
    """SIGKILL mid-call: nothing committed past in-flight tasks (Faust's concurrency>1 / noack loss);
    restart → every task answered."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url)
    await fake_llm.set_mode(latency=4.0)
    w = await c.started("a")
    ts = [task(agent, n=i) for i in range(30)]
    ids = {t["task_id"] for t in ts}
    await produce(topics.task_topic(agent), [encode(t) for t in ts])
    await eventually(lambda: fake_llm.in_flight >= 20, timeout=30, interval=0.1, what=">= 20 calls in flight")
    await asyncio.sleep(2.5)  # more than two commit intervals with every call still open
    offsets = await committed(c.app_id, topics.task_topic(agent))
    assert all(o <= 0 for o in offsets.values()), f"committed past in-flight tasks: {offsets}"
    in_flight_at_kill = {r.task_id for r in fake_llm.requests}
    w.kill()
    await fake_llm.set_mode(latency=0.2)
    started = time.monotonic()
    await c.started("a")  # same data dir: a restart on the same host
    results = await results_for(ids, timeout=120)
    elapsed = time.monotonic() - started
    assert_one_distinct_success(results, ids)
    calls = calls_per_task(fake_llm, ids)
    interrupted = {t: calls[t] for t in in_flight_at_kill}
    rest = {t: calls[t] for t in ids - in_flight_at_kill}
    print(
        f"\nSIGKILL: {len(in_flight_at_kill)} calls in flight at kill; all {len(ids)} answered {elapsed:.1f}s after "
        f"restart; calls per interrupted task max {max(interrupted.values())}, "
        f"per other task max {max(rest.values(), default=0)}"
    )
    assert len(in_flight_at_kill) >= 20
    assert max(interrupted.values()) <= 2
    assert all(v == 1 for v in rest.values())


async def test_sigterm_with_calls_in_flight_exits_cleanly_and_loses_nothing(cluster_factory, fake_llm):
    """SIGTERM mid-call: clean exit within the grace period (Faust's wait_empty hang), nothing lost,
    nothing run twice after finishing."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url, AGENTS_STREAM_SHUTDOWN_GRACE_S="6")
    await fake_llm.set_mode(latency=2.0)
    w = await c.started("a")
    ts = [task(agent, n=i) for i in range(20)]
    ids = {t["task_id"] for t in ts}
    await produce(topics.task_topic(agent), [encode(t) for t in ts])
    await eventually(lambda: fake_llm.in_flight >= 10, timeout=30, interval=0.1, what="calls in flight")
    code, took = await asyncio.to_thread(w.terminate, 40.0)
    print(f"\nSIGTERM: exit code {code} after {took:.1f}s (grace 6s)")
    assert code == 0, w.tail()
    assert took < 6 + 15
    await c.started("a")
    results = await results_for(ids, timeout=90)
    assert_one_distinct_success(results, ids)
    assert max(calls_per_task(fake_llm, ids).values()) <= 2


@pytest.mark.exclusive  # it restarts the shared broker
async def test_broker_restart_with_tasks_in_flight_completes_every_task_once(cluster_factory, fake_llm):
    """Layer 3: the broker goes away mid-work (failed sends and commits) and returns; the worker survives
    and loses nothing."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url)
    await fake_llm.set_mode(latency=3.0)
    w = await c.started()
    ts = [task(agent, n=i) for i in range(10)]
    ids = {t["task_id"] for t in ts}
    await produce(topics.task_topic(agent), [encode(t) for t in ts])
    await eventually(lambda: fake_llm.in_flight >= 5, timeout=30, interval=0.1, what="calls in flight")
    broker = str(ROOT / "scripts" / "broker.sh")
    await asyncio.to_thread(subprocess.run, ["bash", broker, "stop"], check=True, timeout=60)
    await asyncio.sleep(4)
    await asyncio.to_thread(subprocess.run, ["bash", broker, "start"], check=True, timeout=120)
    results = await results_for(ids, timeout=120)
    assert w.proc.poll() is None, "the worker survived the broker restart\n" + w.tail()
    assert_one_distinct_success(results, ids)


async def test_second_worker_joining_mid_run_loses_and_duplicates_nothing(cluster_factory, fake_llm):
    """Rebalance (Faust drops and acks buffered events): scale from 1 to 2 workers mid-run;
    every task exactly one distinct result."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url)
    await fake_llm.set_mode(latency=0.3)
    await c.started("a")
    ts = [task(agent, n=i) for i in range(300)]
    ids = {t["task_id"] for t in ts}
    await produce(topics.task_topic(agent), [encode(t) for t in ts])
    await eventually(lambda: len(fake_llm.requests) >= 30, timeout=30, interval=0.1, what="work under way")
    await c.started("b")
    results = await results_for(ids, timeout=180)
    assert_one_distinct_success(results, ids)
    calls = calls_per_task(fake_llm, ids)
    print(f"\nscale-out: {len(ids)} tasks, {sum(calls.values())} provider calls, max {max(calls.values())} per task")
    assert max(calls.values()) <= 2


async def test_permanent_provider_error_ends_failed_and_dead_lettered(cluster_factory, fake_llm):
    """HTTP 400 is the task's own fault: one `failed` result and one DLQ record with error_layer=downstream,
    no retries."""
    from agents_stream.testing.fakellm import status

    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url)
    await c.started()
    fake_llm.enqueue(status(400, body={"error": {"message": "bad request"}}))
    t = task(agent)
    await produce(topics.task_topic(agent), [encode(t)])
    results = await results_for({t["task_id"]}, timeout=60)
    body = json.loads(results[t["task_id"]][0].value)
    assert body["status"] == "failed" and body["confidence"] == "failed" and body["error"]
    dlq = await read_topic(topics.dlq_topic(agent), until=lambda s: len(s) >= 1, timeout=30)
    assert len(dlq) == 1 and dlq[0].value == encode(t)[1]
    headers = {k: v.decode() for k, v in dlq[0].headers}
    assert headers["error_layer"] == "downstream" and headers["error_reason"].startswith("permanent_error")
    assert calls_per_task(fake_llm, {t["task_id"]})[t["task_id"]] == 1


async def test_task_whose_worker_keeps_dying_is_dead_lettered_for_recovery(cluster_factory, fake_llm):
    """After max_attempts lease lapses the task goes to the DLQ with error_layer=recovery and its attempt count."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url, AGENTS_STREAM_MAX_ATTEMPTS="1")
    await fake_llm.set_mode(latency=30.0)
    w = await c.started("a")
    t = task(agent)
    await produce(topics.task_topic(agent), [encode(t)])
    await eventually(lambda: fake_llm.in_flight >= 1, timeout=30, interval=0.1, what="the call in flight")
    w.kill()
    await c.started("a")
    dlq = await read_topic(topics.dlq_topic(agent), until=lambda s: len(s) >= 1, timeout=60)
    assert len(dlq) == 1 and dlq[0].value == encode(t)[1]
    headers = {k: v.decode() for k, v in dlq[0].headers}
    assert headers["error_layer"] == "recovery" and headers["attempts"] == "1"
    assert headers["original_topic"] == topics.task_topic(agent)


async def test_poison_message_redelivered_after_a_crash_is_dead_lettered_once(cluster_factory, fake_llm):
    """A slow task holds the partition's commit below a poison message behind it; the worker is SIGKILLed, the
    restarted one reads both again: the task gets one result, the poison message still has one dead letter."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url)
    await fake_llm.set_mode(latency=4.0)
    w = await c.started("a")
    slow = next(
        t for t in (task(agent) for _ in range(1000)) if topics.partition_for(t["task_id"].encode(), PARTITIONS) == 0
    )
    await produce(topics.task_topic(agent), [encode(slow)], partition=0)
    await eventually(lambda: fake_llm.in_flight >= 1, timeout=30, interval=0.1, what="the slow call in flight")
    await produce(topics.task_topic(agent), [(b"poison-1", b"{not json")], partition=0)
    await read_topic(topics.dlq_topic(agent), timeout=30, until=lambda seen: len(seen) >= 1)
    assert (await committed(c.app_id, topics.task_topic(agent))).get(0, 0) == 0, "the slow task holds the commit"
    w.kill()
    await fake_llm.set_mode(latency=0.0)
    await c.started("a")
    results = await results_for({slow["task_id"]}, timeout=90)
    assert_one_distinct_success(results, {slow["task_id"]})
    await eventually(lambda: _committed_past(c.app_id, topics.task_topic(agent), 2), timeout=30,
                     what="the commit past both")
    dead = await read_topic(topics.dlq_topic(agent), timeout=5, until=lambda seen: False)
    assert len(dead) == 1, f"the poison message has {len(dead)} dead letters"


async def test_a_dead_letter_a_dead_worker_sent_but_never_marked_is_not_sent_again(cluster_factory, fake_llm):
    """The state a SIGKILL can leave between a dead letter and its marker: the changelog says a worker began the
    dead letters of two poison messages. One is on the dead-letter topic (the worker died after sending it), the
    other is not (it died before). The next worker sends only the missing one: one dead letter each."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url)
    source, dlq, changelog = topics.task_topic(agent), topics.dlq_topic(agent), f"{c.app_id}-tasks-changelog"
    await create_topics([source, dlq, changelog])
    began = json.dumps(json.dumps({"sending": time.time() - 5, "by": "dead-worker"})).encode()  # Faust's encoding
    for partition in (0, 1):
        await produce(source, [(f"pill-{partition}".encode(), b"{not json")], partition=partition)
        await produce(changelog, [(json.dumps(poison_key(source, 0)).encode(), began)], partition=partition)
    sent_before = [
        ("error_reason", b"bad_json"), ("error_layer", b"schema"), ("original_topic", source.encode()),
        ("original_partition", b"0"), ("original_offset", b"0"), ("attempts", b"1"),
    ]
    await produce(dlq, [(b"pill-0", b"{not json")], headers=sent_before)
    w = await c.started("a")
    await eventually(lambda: _committed_past(c.app_id, source, 1, partitions=(0, 1)), timeout=60,
                     what="both pills committed")
    dead = await read_topic(dlq, timeout=5, until=lambda seen: False)
    per_pill = Counter(dict(m.headers)["original_partition"] for m in dead)
    assert per_pill == {b"0": 1, b"1": 1}, f"dead letters per pill partition: {per_pill}"
    assert f"is on {dlq} already" in w.tail(400), "the first pill's dead letter was found on the topic"
    marks = await read_topic(changelog, timeout=5, until=lambda seen: False, keep=lambda m: b"dead/" in (m.key or b""))
    last = {m.partition: json.loads(json.loads(m.value)) for m in marks}
    assert all("at" in last[p] for p in (0, 1)), f"both marked dead-lettered: {last}"


async def _committed_past(group: str, topic: str, offset: int, partitions: tuple[int, ...] = (0,)) -> bool:
    done = await committed(group, topic)
    return all(done.get(p, 0) >= offset for p in partitions)
