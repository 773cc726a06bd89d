"""Scaling out and back in while 100 long provider calls are in flight, on the real broker.

Faust's rebalance waits for every in-flight *event* (docs/faust.md: a 40 s call
stalled a group for 65 s). Here the ledger hands a task to the executor and the
stream moves on, so a rebalance must finish in seconds while the calls keep
running; the worker that runs a call keeps renewing its lease and delivers the
outcome through the outcomes topic to whoever owns the partition by then.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from typing import Any, Callable

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata
from aiokafka.partitioner import DefaultPartitioner

from agents_stream.contract import topics

from .harness import BOOTSTRAP, PARTITIONS, Worker, encode, eventually, produce, results_for, task, unique, write_config

CALL_S = 30.0  # each of the long calls
TASKS = 100
LEASE_TTL_S = "10"  # renewed every ttl/3 by the worker running the call; a cut-off call is re-run after it lapses
GRACE_S = "3"  # SIGTERM: calls still running after this are cut off and left to lease recovery
ALL = set(range(PARTITIONS))


def partition_of(task_id: str) -> int:
    """The partition Faust (and the producer) puts a task_id key in: murmur2, like Kafka's Java client."""
    return DefaultPartitioner()(task_id.encode(), sorted(ALL), sorted(ALL))


def ids_on(partitions: set[int], prefix: str) -> dict[int, str]:
    """One fresh task_id per partition in ``partitions``."""
    out: dict[int, str] = {}
    while len(out) < len(partitions):
        task_id = f"{prefix}-{uuid.uuid4().hex[:10]}"
        p = partition_of(task_id)
        if p in partitions:
            out.setdefault(p, task_id)
    return out


async def group_owners(admin: AIOKafkaAdminClient, group: str, topic: str) -> tuple[str, dict[str, set[int]]]:
    """The group's state as the broker's coordinator has it, and each member's (web URL's) partitions of ``topic``."""
    [response] = await asyncio.wait_for(admin.describe_consumer_groups([group]), 10)
    _error, _group, state, _type, _protocol, members = response.groups[0]
    owners: dict[str, set[int]] = {}
    for member_id, _client, _host, metadata, assignment in members:
        try:  # Faust's join metadata carries the member's ClientMetadata as JSON, with its web URL
            url = json.loads(ConsumerProtocolMemberMetadata.decode(metadata).user_data)["url"]
        except (ValueError, KeyError, TypeError):
            url = member_id
        parts: set[int] = set()
        if assignment:  # empty until the leader's SyncGroup hands it out
            decoded = ConsumerProtocolMemberAssignment.decode(assignment)
            parts = {p for t, ps in decoded.assignment if t == topic for p in ps}
        owners[url] = parts
    return state, owners


async def wait_for_group(
    group: str, topic: str, want: Callable[[dict[str, set[int]]], bool], *, since: float, timeout: float,
) -> tuple[float, float | None, dict[str, set[int]]]:
    """Poll the coordinator until the group is Stable with ``want(owners)``: (seconds to that, seconds to the
    first non-Stable state seen, if any, both from ``since``, and the owners)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    await asyncio.wait_for(admin.start(), 30)
    left_stable: float | None = None
    last: Any = None
    try:
        while time.monotonic() - since < timeout:
            state, owners = await group_owners(admin, group, topic)
            last = (state, owners)
            if state != "Stable" and left_stable is None:
                left_stable = time.monotonic() - since
            if state == "Stable" and want(owners):
                return time.monotonic() - since, left_stable, owners
            await asyncio.sleep(0.1)
    finally:
        await admin.close()
    raise AssertionError(f"group {group} not as wanted after {timeout}s; last: {last!r}")


def name_of(workers: list[Worker], url: str) -> str:
    return next((w.name for w in workers if url.rstrip("/").endswith(f":{w.web_port}")), url)


def by_worker(owners: dict[str, set[int]], workers: list[Worker]) -> dict[str, set[int]]:
    return {name_of(workers, url): parts for url, parts in owners.items()}


def answered(fake, ids: set[str]) -> int:
    """Calls for these tasks the fake has already answered."""
    return sum(1 for r in fake.requests if r.task_id in ids and r.status is not None)


async def probe(agent: str, partitions: set[int], prefix: str) -> dict[int, float]:
    """Publish one quick task per partition; seconds from publishing to its result (the result's timestamp)."""
    probes = ids_on(partitions, prefix)
    published = time.time()
    await produce(topics.task_topic(agent), [encode(task(agent, tid)) for tid in probes.values()])
    results = await results_for(set(probes.values()), timeout=90)
    assert set(results) == set(probes.values()), f"probes without a result: {set(probes.values()) - set(results)}"
    return {p: results[tid][0].timestamp / 1000 - published for p, tid in probes.items()}


def assert_one_distinct_success(results: dict, ids: set[str]) -> None:
    assert set(results) == ids, (
        f"{len(ids - set(results))} tasks without a result, e.g. {sorted(ids - set(results))[:5]}"
    )
    for task_id, msgs in results.items():
        assert len({m.value for m in msgs}) == 1, f"{task_id} has {len({m.value for m in msgs})} distinct results"
        assert json.loads(msgs[0].value)["status"] == "succeeded", msgs[0].value


def calls_per_task(fake, ids: set[str]) -> Counter:
    return Counter(r.task_id for r in fake.requests if r.task_id in ids)


def _window(stable_s: float, left_s: float | None) -> str:
    if left_s is None:
        return f"{stable_s:.1f} s (no unstable state seen by the 0.1 s poll)"
    return f"{stable_s:.1f} s (rebalancing from {left_s:.1f} s: {stable_s - left_s:.1f} s)"


def print_table(rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    print("\n" + "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows))


@pytest.mark.exclusive  # the rebalance must complete within a bound
async def test_scale_out_and_in_with_100_long_calls_in_flight(cluster_factory, fake_llm, tmp_path):
    """1 → 3 workers and back to 1 while 100 calls of 30 s run: each rebalance ends in seconds, not after the calls;
    every task ends with exactly one distinct result, and no call that kept running is made twice."""
    agent = unique("scale")
    topic = topics.task_topic(agent)
    # The provider's timeout must outlast the 30 s calls (the harness says 10 s; the breaker wants it < 55 s).
    toml = write_config(tmp_path / "scale.toml", [agent], fake_llm.url, timeout_s=CALL_S * 1.5).read_text()
    c = cluster_factory(
        [agent], fake_llm.url, toml=toml,
        AGENTS_STREAM_MAX_IN_FLIGHT="128", AGENTS_STREAM_LEASE_TTL_S=LEASE_TTL_S,
        AGENTS_STREAM_SHUTDOWN_GRACE_S=GRACE_S,
    )
    started = time.monotonic()
    w0 = await c.started("w0")
    rows: list[tuple[str, str]] = [("first worker: start → ready (for scale)", f"{time.monotonic() - started:.1f} s")]

    # -- scale out: 1 → 3 with 100 calls in flight --------------------------------------------------
    await fake_llm.set_mode(latency=CALL_S)
    first = [task(agent, n=i) for i in range(TASKS)]
    ids = {t["task_id"] for t in first}
    await produce(topic, [encode(t) for t in first])
    await eventually(lambda: fake_llm.in_flight >= TASKS, timeout=30, interval=0.1, what=f"{TASKS} calls in flight")
    calls_started = min(r.ts for r in fake_llm.requests if r.task_id in ids)
    print(
        f"\nscale-out: {TASKS} calls of {CALL_S:.0f}s in flight on w0 "
        f"({time.time() - calls_started:.1f}s after the first began)"
    )

    since = time.monotonic()
    w1, w2 = c.worker("w1").start(), c.worker("w2").start()
    workers = [w0, w1, w2]
    stable_s, left_s, owners = await wait_for_group(
        c.app_id, topic, lambda o: len(o) == 3 and all(o.values()) and set().union(*o.values()) == ALL,
        since=since, timeout=CALL_S,
    )
    done_at_stable, in_flight_at_stable = answered(fake_llm, ids), fake_llm.in_flight
    await asyncio.gather(w1.wait_ready(), w2.wait_ready())
    ready_s = time.monotonic() - since
    out_owners = by_worker(owners, workers)
    print(f"scale-out: group Stable with 3 members after {stable_s:.1f}s ({out_owners}); "
          f"{in_flight_at_stable} calls still in flight, {done_at_stable} answered; new workers ready after "
          f"{ready_s:.1f}s")
    # The rebalance did not wait for the calls: it was over while every one of them still ran.
    assert done_at_stable == 0, f"{done_at_stable} of the long calls had ended before the group was stable"
    assert stable_s < CALL_S / 2, stable_s

    # New tasks, on every partition, answered at once (new calls get no latency; the 100 keep theirs).
    await fake_llm.set_mode(latency=0.0)
    new_parts = out_owners["w1"] | out_owners["w2"]
    took = await probe(agent, ALL, "probe-out")
    done_at_probe = answered(fake_llm, ids)
    on_new = max(took[p] for p in new_parts)
    on_w0 = max(took[p] for p in out_owners["w0"])
    print(f"scale-out: a new task took {min(took.values()):.2f}..{on_new:.2f}s on w1/w2's partitions, "
          f"{on_w0:.2f}s at most on w0's ({done_at_probe} long calls answered by then)")
    assert on_new < 10, took

    results = await results_for(ids, timeout=CALL_S * 3)
    assert_one_distinct_success(results, ids)
    calls = calls_per_task(fake_llm, ids)
    out_done_s = max(m.timestamp / 1000 for msgs in results.values() for m in msgs) - calls_started
    print(
        f"scale-out: all {TASKS} answered {out_done_s:.1f}s after the first call began; calls per task "
        f"{dict(Counter(calls.values()))}"
    )
    # The calls kept running on w0 (its heartbeats renewed the leases the new owners read): none ran twice.
    assert set(calls.values()) == {1}, {t: n for t, n in calls.items() if n != 1}
    moved = {t for t in ids if partition_of(t) in new_parts}
    rows += [
        ("scale-out: 1 → 3 workers, group Stable (broker)", _window(stable_s, left_s)),
        ("scale-out: new workers ready (/readyz)", f"{ready_s:.1f} s"),
        ("scale-out: long calls answered when Stable", f"{done_at_stable} of {TASKS}"),
        ("scale-out: new task → result on w1/w2 partitions", f"{min(took[p] for p in new_parts):.2f}..{on_new:.2f} s"),
        ("scale-out: new task → result on w0 partitions",
         f"{min(took[p] for p in out_owners['w0']):.2f}..{on_w0:.2f} s"),
        ("scale-out: tasks whose partition moved", f"{len(moved)} of {TASKS}, each 1 call"),
        ("scale-out: all 100 answered after first call", f"{out_done_s:.1f} s"),
    ]

    # -- scale back in: 3 → 1 with 100 calls in flight ------------------------------------------------
    await eventually(lambda: fake_llm.in_flight == 0, timeout=30, interval=0.2, what="no call in flight")
    await fake_llm.set_mode(latency=CALL_S)
    second = [task(agent, n=i) for i in range(TASKS)]
    ids2 = {t["task_id"] for t in second}
    await produce(topic, [encode(t) for t in second])
    await eventually(lambda: fake_llm.in_flight >= TASKS, timeout=30, interval=0.1,
                     what=f"{TASKS} calls in flight on 3 workers")
    _s, _left, owners = await wait_for_group(c.app_id, topic, lambda o: len(o) == 3, since=time.monotonic(), timeout=10)
    in_owners = by_worker(owners, workers)
    owner_of = {p: name for name, parts in in_owners.items() for p in parts}
    where = Counter(owner_of[partition_of(t)] for t in ids2)
    per_worker = {w.name: (await w.readyz())["in_flight"] for w in workers}
    print(f"scale-in: {TASKS} calls in flight, by partition owner {dict(where)}, by /readyz {per_worker}")

    since, sigterm_at = time.monotonic(), time.time()
    stopping = [asyncio.create_task(asyncio.to_thread(w.terminate, 60.0)) for w in (w1, w2)]
    await fake_llm.set_mode(latency=0.0)  # calls started from now on (re-runs of cut-off ones) answer at once
    owned_s, left_s, owners = await wait_for_group(
        c.app_id, topic, lambda o: len(o) == 1 and set().union(*o.values()) == ALL, since=since, timeout=60,
    )
    assert name_of(workers, next(iter(owners))) == "w0", owners
    done_at_owned = answered(fake_llm, ids2)
    exits = [await s for s in stopping]
    print(f"scale-in: w0 owns all {PARTITIONS} partitions {owned_s:.1f}s after SIGTERM; "
          f"exits {[(code, round(s, 1)) for code, s in exits]}; {done_at_owned} long calls answered by then")
    assert all(code == 0 for code, _ in exits), (w1.tail(), w2.tail())
    assert owned_s < CALL_S / 2, owned_s

    took_in = await probe(agent, ALL, "probe-in")
    print(f"scale-in: a new task took {min(took_in.values()):.2f}..{max(took_in.values()):.2f}s on the survivor")

    results2 = await results_for(ids2, timeout=CALL_S * 4)
    assert_one_distinct_success(results2, ids2)
    calls2 = calls_per_task(fake_llm, ids2)
    kept = {t for t in ids2 if owner_of[partition_of(t)] == "w0"}
    cut = ids2 - kept
    in_done_s = max(m.timestamp / 1000 for msgs in results2.values() for m in msgs) - sigterm_at
    cut_done_s = max(m.timestamp / 1000 for t in cut for m in results2[t]) - sigterm_at
    print(f"scale-in: all {TASKS} answered {in_done_s:.1f}s after SIGTERM; calls per task on w0's partitions "
          f"{dict(Counter(calls2[t] for t in kept))}, on the stopped workers' {dict(Counter(calls2[t] for t in cut))}")
    # w0's own calls kept running through the rebalance; the stopped workers' calls were cut off after the
    # grace (30 s calls, 3 s grace) and re-run once by w0 when their leases lapsed: never more.
    assert all(calls2[t] == 1 for t in kept), {t: calls2[t] for t in kept if calls2[t] != 1}
    assert all(calls2[t] == 2 for t in cut), Counter(calls2[t] for t in cut)
    rows += [
        ("scale-in: 3 → 1 workers (SIGTERM ×2), w0 owns all (broker)", _window(owned_s, left_s)),
        ("scale-in: stopped workers exited", ", ".join(f"code {code} in {s:.1f} s" for code, s in exits)),
        ("scale-in: new task → result on the survivor", f"{min(took_in.values()):.2f}..{max(took_in.values()):.2f} s"),
        ("scale-in: calls per task, w0's / cut off", f"{len(kept)} × 1 / {len(cut)} × 2"),
        ("scale-in: cut-off tasks re-run and answered after SIGTERM", f"{cut_done_s:.1f} s (lease {LEASE_TTL_S} s)"),
        ("scale-in: all 100 answered after SIGTERM", f"{in_done_s:.1f} s"),
    ]
    print_table(rows)
