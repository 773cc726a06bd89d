"""A task in and its result out, poison messages dead-lettered, dedupe, and routing, on the real broker with real
worker processes."""

from __future__ import annotations

import asyncio
import json

from agents_stream.contract import topics

from .harness import (
    PARTITIONS,
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


async def test_valid_task_gets_exactly_one_result_and_the_offset_advances(cluster_factory, fake_llm):
    """A task in → one `succeeded` result out; the group's committed offset moves past it."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url)
    await c.started()
    t = task(agent)
    await produce(topics.task_topic(agent), [encode(t)])
    results = await results_for({t["task_id"]}, timeout=60)
    assert len(results[t["task_id"]]) == 1
    body = json.loads(results[t["task_id"]][0].value)
    assert body["status"] == "succeeded" and body["agent_name"] == agent and body["attempts"] == 1
    assert body["usage"]["output_tokens"] > 0
    offsets = await eventually(lambda: _sum_committed(c.app_id, topics.task_topic(agent)), timeout=20,
                               what="a committed offset")
    assert offsets == 1
    assert len([r for r in fake_llm.requests if r.task_id == t["task_id"]]) == 1
    # One changelog record per table write (running, then succeeded): the ledger awaits the table's own send
    # rather than sending the record a second time.
    changelog = await read_topic(
        f"{c.app_id}-tasks-changelog", until=lambda seen: len(seen) >= 2, timeout=30,
        keep=lambda m: m.key == json.dumps(t["task_id"]).encode(),  # Faust writes changelog keys as JSON
    )
    assert [json.loads(m.value)["state"] for m in changelog] == ["running", "succeeded"]


async def test_a_worker_finishes_the_tasks_it_holds_without_the_outcomes_topic(cluster_factory, fake_llm):
    """The short path: once the worker is a confirmed member of its group (a commit accepted), the outcome
    of a task it leased and ran is applied by its own ledger; every task still has exactly one result, and no
    final outcome record crosses agent.outcomes.<app> (docs/decisions.md, "Outcomes applied where they ran")."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url)
    await c.started()
    warm = task(agent)
    await produce(topics.task_topic(agent), [encode(warm)])
    await results_for({warm["task_id"]}, timeout=60)
    await eventually(lambda: _sum_committed(c.app_id, topics.task_topic(agent)), timeout=20, what="a commit")
    ts = [task(agent, n=i) for i in range(20)]
    ids = {t["task_id"] for t in ts}
    await produce(topics.task_topic(agent), [encode(t) for t in ts])
    results = await results_for(ids, timeout=60)
    assert {k: len(v) for k, v in results.items()} == {i: 1 for i in ids}
    finals = await read_topic(
        topics.outcomes_topic(c.app_id), until=lambda seen: False, timeout=5,
        keep=lambda m: m.key.decode() in ids and json.loads(m.value)["kind"] in ("succeeded", "failed"),
    )
    assert finals == [], f"{len(finals)} of {len(ids)} final outcomes went through the topic"


async def test_keyless_task_is_routed_to_its_partition_and_answered_once(cluster_factory, fake_llm):
    """A task in, with the console producer's keyless messages: routed home, one result, offsets committed."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url)
    await create_topics([topics.task_topic(agent)])
    ts = [task(agent, n=i) for i in range(6)]
    # Keyless and all on partition 0: most belong elsewhere.
    await produce(topics.task_topic(agent), [(None, encode(t)[1]) for t in ts], partition=0)
    await c.started()
    ids = {t["task_id"] for t in ts}
    results = await results_for(ids, timeout=60)
    assert {k: len(v) for k, v in results.items()} == {i: 1 for i in ids}
    for msgs in results.values():
        assert json.loads(msgs[0].value)["status"] == "succeeded"
    # Every record on the topic (the 6 originals + the re-routed copies) is committed.
    async def all_committed():
        from .harness import end_offsets
        ends = await end_offsets(topics.task_topic(agent))
        done = await committed(c.app_id, topics.task_topic(agent))
        return all(done.get(p, 0) == end for p, end in ends.items()) and sum(ends.values()) > 6
    await eventually(all_committed, timeout=20, what="every offset committed")


async def test_same_task_three_times_calls_the_provider_once_and_reemits_the_stored_result(cluster_factory, fake_llm):
    """Idempotency: a duplicate never reaches a provider; a re-emitted result is the stored record byte for byte."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url)
    await c.started()
    t = task(agent)
    await produce(topics.task_topic(agent), [encode(t)])
    first = await results_for({t["task_id"]}, timeout=60)
    await produce(topics.task_topic(agent), [encode(t), encode(t)])
    msgs = await read_topic(
        "agent.results", until=lambda seen: len(seen) >= 3, timeout=30,
        keep=lambda m: m.key == t["task_id"].encode(),
    )
    assert len({m.value for m in msgs}) == 1, "one distinct result"
    assert msgs[0].value == first[t["task_id"]][0].value
    assert len([r for r in fake_llm.requests if r.task_id == t["task_id"]]) == 1


async def test_poison_messages_are_dead_lettered_with_headers_and_valid_tasks_still_flow(cluster_factory, fake_llm):
    """Each poison kind → one DLQ record with every header and the original bytes; neighbours succeed."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url)
    await c.started()
    poison = {
        "null": None,
        "utf8": b"\xff\xfe\x00bad",
        "json": b"{not json",
        "seed": b'{"task_id": "invalid-uuid-format", "agent_name": 12345, "instruction": null}',
        "missing": json.dumps({"task_id": "m1", "agent_name": agent}).encode(),
        "types": json.dumps({"task_id": "t1", "agent_name": agent, "instruction": ["x"],
                             "context_data": "no"}).encode(),
        "big": json.dumps({"task_id": "b1", "agent_name": agent, "instruction": "x" * 300_000}).encode(),
    }
    good = [task(agent, n=i) for i in range(4)]
    records = (
        [encode(good[0])] + [(f"poison-{k}".encode(), v) for k, v in poison.items()] + [encode(g) for g in good[1:]]
    )
    await produce(topics.task_topic(agent), records)
    dlq = await read_topic(topics.dlq_topic(agent), until=lambda seen: len(seen) >= len(poison), timeout=60)
    by_key = {m.key.decode(): m for m in dlq}
    assert sorted(by_key) == sorted(f"poison-{k}" for k in poison) and len(dlq) == len(poison)
    reasons = {}
    for name, raw in poison.items():
        m = by_key[f"poison-{name}"]
        assert m.value == raw, f"{name}: original bytes unchanged"
        headers = {k: v.decode() for k, v in m.headers}
        assert set(headers) >= {"error_reason", "error_layer", "original_topic", "original_partition",
                                "original_offset", "failed_at", "attempts"}
        assert headers["error_layer"] == "schema" and headers["original_topic"] == topics.task_topic(agent)
        reasons[name] = headers["error_reason"].split(":")[0]
    assert reasons == {
        "null": "null_value", "utf8": "invalid_utf8", "json": "not_json", "seed": "schema_violation",
        "missing": "schema_violation", "types": "schema_violation", "big": "payload_too_large",
    }
    results = await results_for({g["task_id"] for g in good}, timeout=60)
    assert all(len(v) == 1 and json.loads(v[0].value)["status"] == "succeeded" for v in results.values())
    ends = await read_topic(topics.task_topic(agent), until=lambda s: len(s) >= len(records), timeout=10)
    assert len(ends) == len(records)
    await eventually(lambda: _sum_committed(c.app_id, topics.task_topic(agent), want=len(records)), timeout=20,
                     what="all offsets committed")


async def _sum_committed(group: str, topic: str, want: int | None = None) -> int | None:
    offs = await committed(group, topic)
    total = sum(o for o in offs.values() if o > 0)
    if want is not None:
        return total if total == want else None
    return total or None


assert PARTITIONS >= 2


async def test_replacement_worker_recovers_the_table_from_the_changelog(cluster_factory, fake_llm):
    """A worker on a new machine (empty data dir) rebuilds the task table from Kafka:
    finished tasks are not called again."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url)
    w = await c.started("a")
    ts = [task(agent, n=i) for i in range(5)]
    ids = {t["task_id"] for t in ts}
    await produce(topics.task_topic(agent), [encode(t) for t in ts])
    first = await results_for(ids, timeout=60)
    w.kill()
    await c.started("b")  # its own, empty data dir
    await produce(topics.task_topic(agent), [encode(t) for t in ts])
    msgs = await read_topic(
        "agent.results", until=lambda seen: len(seen) >= 2 * len(ids), timeout=60,
        keep=lambda m: m.key is not None and m.key.decode() in ids,
    )
    assert len(msgs) >= 2 * len(ids)
    for m in msgs:
        assert m.value == first[m.key.decode()][0].value, "re-emitted result is the stored record"
    calls = [r.task_id for r in fake_llm.requests if r.task_id in ids]
    assert sorted(calls) == sorted(ids), "one provider call per task, none after recovery"


async def test_a_worker_with_another_partition_count_stops_at_start_and_says_why(cluster_factory):
    """Tables are co-partitioned with the shared input topics: a worker configured with another count than they
    have must not start (it would crash at its first event); it exits with the topics and the setting named."""
    from .harness import create_topics

    await create_topics([topics.APPROVALS])  # shared by every app id; created with the default count if missing
    c = cluster_factory([unique("mismatch")], None)
    w = c.worker(AGENTS_STREAM_PARTITIONS=str(PARTITIONS // 2)).start()
    code = await asyncio.to_thread(w.proc.wait, 90)
    assert code != 0
    assert (f"AGENTS_STREAM_PARTITIONS={PARTITIONS // 2}" in w.tail(200)
            and f"'agent.approvals': {PARTITIONS}" in w.tail(200))
