"""Finished records expire on the real broker, and never while their task message can still be read.

The task topic keeps its messages 3 s (``retention.ms``) but closes a segment only after an hour (``segment.ms``):
Kafka deletes whole closed segments, so the messages outlive their retention, as they do by up to 7 days with the
defaults. Asked for 1 s, the worker keeps its finished records past the TTL and the retention while the messages
are there; a group rewound to the start re-reads every message and is answered from the records (no model call,
one distinct result per task). Once the messages are really gone (DeleteRecords moves the log start past them, as
retention does when the segment closes) the records expire, through tombstones in the changelog, so a worker
recovering the table afterwards does not have them either; a task id sent again after that runs anew."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime
from urllib.parse import quote

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.records_to_delete import RecordsToDelete

from agents_stream.contract import topics

from .harness import (
    BOOTSTRAP,
    PARTITIONS,
    create_topics,
    encode,
    end_offsets,
    eventually,
    produce,
    read_topic,
    results_for,
    task,
    uncommitted,
    unique,
)


async def test_finished_records_outlive_their_task_messages_and_a_rewound_group_runs_nothing_again(
    cluster_factory, fake_llm,
):
    agent = unique("expiring")
    task_topic = topics.task_topic(agent)
    await create_topics([task_topic], configs={"retention.ms": "3000", "segment.ms": "3600000"})
    c = cluster_factory([agent], fake_llm.url, AGENTS_STREAM_RECORD_TTL_S="1", AGENTS_STREAM_EXPIRY_INTERVAL_S="0.5",
                        AGENTS_STREAM_EXPIRY_BATCH="4")
    w0 = await c.started()
    batch = [task(agent, n=i) for i in range(12)]
    await produce(task_topic, [encode(t) for t in batch])
    ids = {t["task_id"] for t in batch}
    got = await results_for(ids, timeout=60)
    calls = len(fake_llm.requests)
    last_done = max(datetime.fromisoformat(json.loads(m[0].value)["completed_at"]).timestamp() for m in got.values())
    await asyncio.sleep(max(0.0, last_done + 3.0 + 4.0 - time.time()))  # past the retention, and eight sweeps more
    assert set((await _log_starts(task_topic)).values()) == {0}, "the messages are still in their topic"
    assert await _all(w0, ids, known=True), "a record stays while its task message can be read"
    assert "shorter than the task topics' retention" in (c.tmp / f"{c.app_id}-w0.log").read_text()

    w0.terminate()  # the group empty, its offsets rewound to the start: every message is read again
    await eventually(lambda: _rewound(c.app_id, task_topic), timeout=30, what="the group's offsets rewound")
    w1 = await c.started("w1")  # a fresh data dir: the table recovered from the changelog alone
    await eventually(lambda: _read_all(c.app_id, task_topic), timeout=60, what="the rewound group read every message")
    answered = await read_topic(
        topics.RESULTS, timeout=30, until=lambda seen: {m.key.decode() for m in seen} >= ids,
        keep=lambda m: m.key is not None and m.key.decode() in ids,
    )
    distinct = {task_id: {m.value for m in answered if m.key.decode() == task_id} for task_id in ids}
    assert all(len(values) == 1 for values in distinct.values()), "one result per task, re-read from its record"
    assert len(fake_llm.requests) == calls, "no task ran again"

    ends = await end_offsets(task_topic)
    await _delete_records(task_topic, ends)  # what retention does once the segment closes
    assert await _log_starts(task_topic) == ends, "the messages are gone"
    await eventually(lambda: _all(w1, ids, known=False), timeout=40, what="every finished record expired")

    w1.kill()
    w2 = await c.started("w2")
    assert await _all(w2, ids, known=False), "the tombstones are in the changelog"
    again = batch[0]
    await produce(task_topic, [encode(again)])
    key = again["task_id"].encode()
    # Its results so far are two identical records (the first run's and the rewound group's copy): wait for another.
    rerun = await read_topic(topics.RESULTS, timeout=60, until=lambda seen: len({m.value for m in seen}) >= 2,
                             keep=lambda m: m.key == key)
    assert len({m.value for m in rerun}) == 2, (
        "after its record expired, the same task id is a new task (documented: ids are unique within the TTL)"
    )
    assert all(json.loads(m.value)["status"] == "succeeded" for m in rerun) and len(got[again["task_id"]]) == 1


async def _all(worker, ids: set[str], *, known: bool) -> bool:
    """Every task of ``ids`` is known to ``worker`` (``known``), or none is."""
    for task_id in ids:
        body = await worker.get(f"/tasks/{quote(task_id, safe='')}")
        unknown = isinstance(body, dict) and "unknown task_id" in body.get("error", "")
        if unknown == known:
            return False
    return True


def _tps(topic: str) -> list[TopicPartition]:
    return [TopicPartition(topic, p) for p in range(PARTITIONS)]


async def _log_starts(topic: str) -> dict[int, int]:
    """The broker's log start offset (ListOffsets earliest) of each partition of ``topic``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP)
    await asyncio.wait_for(consumer.start(), 30)
    try:
        starts = await asyncio.wait_for(consumer.beginning_offsets(_tps(topic)), 30)
    finally:
        await consumer.stop()
    return {tp.partition: offset for tp, offset in starts.items()}


async def _rewound(group: str, topic: str) -> bool:
    """Commit offset 0 on every partition of ``topic`` for ``group`` (refused while the group has members)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP, group_id=group, enable_auto_commit=False)
    await asyncio.wait_for(consumer.start(), 30)
    try:
        consumer.assign(_tps(topic))
        await asyncio.wait_for(consumer.commit({tp: 0 for tp in _tps(topic)}), 30)
        return True
    except Exception:  # the group still has the stopped worker as a member: ask again
        return False
    finally:
        await consumer.stop()


async def _read_all(group: str, topic: str) -> bool:
    return await uncommitted(group, topic) == 0


async def _delete_records(topic: str, before: dict[int, int]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    await asyncio.wait_for(admin.start(), 30)
    try:
        records = {TopicPartition(topic, p): RecordsToDelete(offset) for p, offset in before.items()}
        await asyncio.wait_for(admin.delete_records(records), 30)
    finally:
        await admin.close()
