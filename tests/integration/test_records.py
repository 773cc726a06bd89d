"""Records too large never crash a worker nor strand a partition: a real worker, the broker and
a fake LLM whose answers make a multi-step task's record grow past Kafka's record limit."""

from __future__ import annotations

import json

from agents_stream.contract import topics
from agents_stream.testing.fakellm import ok

from .harness import PARTITIONS, encode, eventually, produce, read_topic, results_for, task, unique


def _same_partition(first: str, count: int) -> list[str]:
    """``count`` task ids on the partition of ``first`` (Kafka's murmur2 placement, as the ledger's)."""
    home = topics.partition_for(first.encode(), PARTITIONS)
    ids, n = [], 0
    while len(ids) < count:
        n += 1
        candidate = f"{first}-behind-{n}"
        if topics.partition_for(candidate.encode(), PARTITIONS) == home:
            ids.append(candidate)
    return ids


async def test_a_task_whose_steps_outgrow_a_record_fails_and_the_tasks_behind_it_are_answered(
    cluster_factory, fake_llm,
):
    """Five steps answered with 300 KB each: the task's record would pass 1 MB at the fourth step. The worker
    does not crash: the task ends failed with result_too_large and a dead letter saying so, and the two tasks
    behind it on its partition are answered."""
    agent = unique("grower")
    # answers up to 400 KB pass the per-answer bound: it is the record's growth that must be caught
    c = cluster_factory([agent], fake_llm.url, AGENTS_STREAM_ANSWER_MAX_BYTES="400000")
    worker = await c.started("a")
    fake_llm.default = ok("y" * 300_000)
    big = task(agent, task_id=unique("big"), steps=["one", "two", "three", "four", "five"])
    behind = [task(agent, task_id=task_id) for task_id in _same_partition(big["task_id"], 2)]
    await produce(topics.task_topic(agent), [encode(t) for t in (big, *behind)])

    ids = {big["task_id"], *(t["task_id"] for t in behind)}
    results = await results_for(ids, timeout=180)
    assert worker.proc is not None and worker.proc.poll() is None, f"the worker died:\n{worker.tail()}"
    failed = json.loads(results[big["task_id"]][0].value)
    print(f"\nrecords: {failed['status']} {failed['error'][:120]}")
    assert failed["status"] == "failed" and failed["error"].startswith("result_too_large: ")
    for t in behind:
        assert [json.loads(m.value)["status"] for m in results[t["task_id"]]] == ["succeeded"]
    dead = await read_topic(
        topics.dlq_topic(agent), timeout=60, until=lambda seen: len(seen) >= 1,
        keep=lambda m: m.key == big["task_id"].encode(),
    )
    assert [dict(m.headers)["error_reason"].decode() for m in dead] == [failed["error"]]
    assert json.loads(dead[0].value) == big, "the dead letter carries the original task"
    await eventually(worker.readyz, timeout=10, what="the worker still answering /readyz")


async def test_a_send_too_large_for_the_producer_fails_its_own_future_and_the_producer_keeps_sending():
    """Faust's buffered send of a record over max_request_size raised inside its ProducerBuffer, which killed the
    worker. Through the app's Topic class (GuardedTopic) the send's own future fails with RecordTooLarge instead,
    and the next record goes out."""
    import asyncio

    import faust

    from agents_stream.kafka.delivery import GuardedTopic, RecordTooLarge

    from .harness import BOOTSTRAP, create_topics

    name = unique("it-guarded")
    await create_topics([name], partitions=1)
    app = faust.App(
        unique("guarded"), broker=f"kafka://{BOOTSTRAP}", Topic=GuardedTopic, producer_max_request_size=10_000,
        key_serializer="raw", value_serializer="raw",
    )
    await asyncio.wait_for(app.producer.start(), 30)
    try:
        topic = app.topic(name, key_serializer="raw", value_serializer="raw")
        big = topic.send_soon(key=b"k", value=b"x" * 20_000)
        await asyncio.wait([big], timeout=30)
        assert big.done() and isinstance(big.exception(), RecordTooLarge)
        small = topic.send_soon(key=b"k", value=b"small")
        await asyncio.wait_for(small, 30)
        assert not app.producer.buffer.crashed
    finally:
        await asyncio.wait_for(app.producer.stop(), 30)
    [record] = await read_topic(name, timeout=30, until=lambda seen: len(seen) >= 1)
    assert record.value == b"small"
