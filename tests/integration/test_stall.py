"""A partition whose fetched records never reached the ledger is read again (the rare Faust stall, docs/decisions.md).

The fault is injected where Faust loses them: records aiokafka has fetched (its
position is past them) are dropped before delivery, so nothing fetches them
again. Without the progress check the task would wait until a restart.
"""

from __future__ import annotations

import json

import pytest

from agents_stream.contract import topics
from agents_stream.kafka.consumer import FAULT_DROP_FETCHED

from .harness import all_committed, encode, end_offsets, eventually, produce, read_topic, results_for, task, unique


async def test_records_dropped_after_fetch_are_read_again_and_run_once(cluster_factory, fake_llm):
    agent = unique("stall")
    c = cluster_factory([agent], fake_llm.url)
    w = await c.started(**{FAULT_DROP_FETCHED: f"{topics.task_topic(agent)}=1", "AGENTS_STREAM_STALL_AFTER_S": "3"})
    t = task(agent)
    await produce(topics.task_topic(agent), [encode(t)])
    got = await results_for({t["task_id"]}, timeout=60)
    assert [json.loads(m.value)["status"] for m in got[t["task_id"]]] == ["succeeded"]
    assert sum(1 for r in fake_llm.requests if r.task_id == t["task_id"]) == 1
    assert "Fault injection dropped 1 fetched record" in w.tail(400)
    assert "reading it again from" in w.tail(400), w.tail(80)
    me = (await w.readyz())["worker"]
    alerts = await read_topic(
        topics.CONTROL, timeout=30, until=lambda seen: len(seen) >= 1,
        keep=lambda m: (json.loads(m.value)["event"] == "alert.partition_reread"
                        and json.loads(m.value)["subject"] == me),
    )
    print(f"\nstall: {json.loads(alerts[0].value)}")
    await all_committed(c.app_id, topics.task_topic(agent), timeout=15)


@pytest.mark.parametrize("kept", [0, 1], ids=["all-dropped", "a-gap"])
async def test_table_recovery_whose_changelog_records_were_dropped_reads_them_again(cluster_factory, fake_llm, kept):
    """A worker whose table recovery lost the changelog records it fetched (the scale-in stall,
    docs/decisions.md) reads them again and gets ready with the whole table: an earlier task sent again is
    answered from it, without a model call. All dropped: without the recovery watch Faust waits for them forever.
    All but the last of one partition (``kept``): that record arrives, Faust counts the partition recovered, and
    without the gap check the records before it were never applied (the chaos run: finished tasks ran again)."""
    agent = unique("recover")
    c = cluster_factory([agent], fake_llm.url)
    w0 = await c.started("w0")
    first = [task(agent) for _ in range(16)]
    ids = {t["task_id"] for t in first}
    await produce(topics.task_topic(agent), [encode(t) for t in first])
    before = await results_for(ids, timeout=60)
    assert w0.terminate()[0] == 0, w0.tail()

    # A new worker with an empty data dir recovers the task table from its changelog; the records of it that it
    # fetches first (all, or all of one partition but its last) are dropped after aiokafka passed them.
    changelog = f"{c.app_id}-tasks-changelog"
    ends = await end_offsets(changelog)
    records = sum(ends.values())
    assert records >= len(ids)
    if not kept:
        drops = f"{changelog}={records}"
    else:  # the partition with the most records: all but its last ``kept``, several tasks among them
        partition, end = max(ends.items(), key=lambda item: item[1])
        assert end >= 5, ends  # an owner epoch and two tasks' two records at least
        drops = f"{changelog}:{partition}={end - kept}"
    w1 = c.worker("w1", **{FAULT_DROP_FETCHED: drops, "AGENTS_STREAM_STALL_AFTER_S": "2"}).start()
    await w1.wait_ready(timeout=90)
    assert "Fault injection dropped" in w1.tail(2000)
    said = "never reached the table during its recovery" if kept else "Table recovery of"
    assert said in w1.tail(2000), w1.tail(80)

    calls = len([r for r in fake_llm.requests if r.task_id in ids])
    await produce(topics.task_topic(agent), [encode(t) for t in first])

    async def replayed() -> dict | None:  # every task has its first result already: wait for the second ones
        seen = await results_for(ids, timeout=60)
        return seen if all(len(seen[t]) >= 2 for t in ids) else None

    again = await eventually(replayed, timeout=60, what="a second result for every task")
    for task_id in ids:  # the stored result, byte for byte, and no second call
        assert {m.value for m in again[task_id]} == {before[task_id][0].value}, task_id
        assert len(again[task_id]) == 2, task_id
    assert len([r for r in fake_llm.requests if r.task_id in ids]) == calls == len(ids)
