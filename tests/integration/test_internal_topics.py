"""Malformed, mistyped and deeply nested records on every internal topic of a running worker are skipped: the worker
answers the next task, and its group's commits pass every bad record (none holds an offset)."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiokafka import AIOKafkaProducer

from agents_stream.contract import topics
from agents_stream.testing.script import hang

from .harness import BOOTSTRAP, committed, encode, eventually, produce, results_for, task, unique


def deep(n: int) -> str:
    return "[" * n + "]" * n


async def publish(records: list[tuple[str, bytes | None, bytes]]) -> list[tuple[str, int, int]]:
    """Send (topic, key, value) records; where each landed, as (topic, partition, offset)."""
    producer = AIOKafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all")
    await asyncio.wait_for(producer.start(), 30)
    try:
        futs = [await producer.send(t, key=k, value=v) for t, k, v in records]
        landed = await asyncio.wait_for(asyncio.gather(*futs), 30)
    finally:
        await producer.stop()
    return [(m.topic, m.partition, m.offset) for m in landed]


def bad_records(app_id: str, running: str) -> list[tuple[str, bytes | None, bytes]]:
    outcomes, answers = topics.outcomes_topic(app_id), topics.answers_topic(app_id)
    usage = '"usage":{"input_tokens":1,"output_tokens":1,"cost":%s}'
    succeeded = ('{"schema_version":1,"kind":"succeeded","worker":"forged","dispatch":1,"calls":1,' + usage +
                 ',"route":null,"status":"succeeded","output":%s,"confidence":"high","source":"p","partial":false}')
    store = '{"schema_version":1,"kind":"store","task_id":"x","source":"p","confidence":"high","at":1.0,"output":%s}'
    job_id = unique("job")
    records = [
        (outcomes, running, succeeded % ("0.1", deep(300))),  # held its partition for good before
        (outcomes, running, succeeded % ("NaN", '"x"')),
        (outcomes, running, '{"schema_version":1,"kind":"heartbeat","worker":7,"dispatch":"1","owner":[]}'),
        (outcomes, running, "not json"),
        (outcomes, None, '{"schema_version":1,"kind":"expired","dispatch":1,"worker":"w"}'),
        (answers, "fp", store % deep(300)),  # held its partition for good before
        (answers, "fp", store % "Infinity"),
        (answers, "fp", '{"kind":"lookup","task_id":5}'),
        (topics.APPROVALS, running, '{"task_id":"%s","decision":"approve","by":"x","comment":%s}'
         % (running, deep(300))),
        (topics.APPROVALS, running, '{"task_id":"%s","decision":5,"by":[]}' % running),
        (topics.JOBS, job_id, '{"job_id":"%s","plan":%s}' % (job_id, deep(300))),
        (topics.JOBS, job_id, '{"job_id":"%s","plan":{"steps":"nope"}}' % job_id),
        (topics.JOB_EVENTS, job_id, '{"schema_version":1,"kind":"result","result":{"task_id":"%s/a","status":'
                                    '"succeeded","output":%s}}' % (job_id, deep(300))),
        (topics.JOB_EVENTS, job_id, '{"schema_version":1,"kind":"deadline","worker":{}}'),
        (topics.CIRCUITS, b"forged", '{"v":1,"id":"i","kind":"hello","worker":"w","at":1.0,"x":%s}' % deep(300)),
        (topics.CIRCUITS, b"forged", '{"v":1,"id":"i","kind":"rate_limited","worker":"w","at":1.0,"until":NaN}'),
    ]
    return [(t, k.encode() if isinstance(k, str) else k, v.encode()) for t, k, v in records]


@pytest.mark.exclusive  # it runs the job orchestrator, which reads and answers the shared agent.jobs
async def test_bad_records_on_internal_topics_are_skipped_and_committed_past(cluster_factory, fake_llm):
    """A task is running when the bad records arrive (a forged deep answer for it among them); it and a task sent
    after them are answered, and the group's commit on each internal topic passes each bad record."""
    agent = unique("internal")
    c = cluster_factory([agent], fake_llm.url, AGENTS_STREAM_JOBS="1")
    await c.started()
    fake_llm.enqueue(hang(30))  # the running task's first call hangs (its 10 s timeout, then a retry answers)
    running = task(agent)
    await produce(topics.task_topic(agent), [encode(running)])
    await eventually(lambda: any(r.task_id == running["task_id"] for r in fake_llm.requests), timeout=60,
                     what="the running task's call")
    landed = await publish(bad_records(c.app_id, running["task_id"]))
    after = task(agent)
    await produce(topics.task_topic(agent), [encode(after)])
    results = await results_for({running["task_id"], after["task_id"]}, timeout=120)
    for tid in (running["task_id"], after["task_id"]):
        assert [json.loads(m.value)["status"] for m in results[tid]] == ["succeeded"]
    assert json.loads(results[running["task_id"]][0].value)["source"] != "p"  # not the forged answer

    async def passed() -> list[tuple[str, int, int]]:
        """The bad records (of the topics the group commits) the group's commit has not passed yet."""
        behind = []
        for topic, partition, offset in landed:
            if topic != topics.CIRCUITS and (await committed(c.app_id, topic)).get(partition, -1) <= offset:
                behind.append((topic, partition, offset))
        return behind

    async def none_behind() -> bool:
        return not await passed()

    try:
        await eventually(none_behind, timeout=90, what="commits past every bad record")
    except AssertionError:
        raise AssertionError(f"commits not past {await passed()}:\n{c.workers[0].tail(80)}") from None
