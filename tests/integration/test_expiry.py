"""Finished records expire on the real broker: a worker whose task topic keeps its messages 3 s forgets its
finished tasks after that (asked for 1 s, it keeps them the topic's 3 s), through tombstones in the changelog, so a
worker recovering the table afterwards does not have them either; a task id sent again after that runs anew."""

from __future__ import annotations

import json
import time
from datetime import datetime
from urllib.parse import quote

from agents_stream.contract import topics

from .harness import create_topics, encode, eventually, produce, read_topic, results_for, task, unique


async def test_finished_records_expire_after_the_topics_retention_and_stay_gone_after_a_recovery(
    cluster_factory, fake_llm,
):
    agent = unique("expiring")
    await create_topics([topics.task_topic(agent)], configs={"retention.ms": "3000"})
    c = cluster_factory([agent], fake_llm.url, AGENTS_STREAM_RECORD_TTL_S="1", AGENTS_STREAM_EXPIRY_INTERVAL_S="0.5",
                        AGENTS_STREAM_EXPIRY_BATCH="4")
    w0 = await c.started()
    batch = [task(agent, n=i) for i in range(12)]
    await produce(topics.task_topic(agent), [encode(t) for t in batch])
    ids = {t["task_id"] for t in batch}
    got = await results_for(ids, timeout=60)
    last_done = max(datetime.fromisoformat(json.loads(m[0].value)["completed_at"]).timestamp() for m in got.values())
    await eventually(lambda: _all_gone(w0, ids), timeout=40, what="every finished record expired")
    assert time.time() >= last_done + 3.0, "kept for the topic's 3 s retention, not the 1 s asked for"
    assert "shorter than the task topics' retention" in (c.tmp / f"{c.app_id}-w0.log").read_text()

    w0.kill()
    w1 = await c.started("w1")  # a fresh data dir: the table recovered from the changelog alone
    assert await _all_gone(w1, ids), "the tombstones are in the changelog"
    again = batch[0]
    await produce(topics.task_topic(agent), [encode(again)])
    key = again["task_id"].encode()
    rerun = await read_topic(topics.RESULTS, timeout=60, until=lambda seen: len(seen) >= 2, keep=lambda m: m.key == key)
    assert len({m.value for m in rerun}) == 2, (
        "after its record expired, the same task id is a new task (documented: ids are unique within the TTL)"
    )
    assert all(json.loads(m.value)["status"] == "succeeded" for m in rerun) and len(got[again["task_id"]]) == 1


async def _all_gone(worker, ids: set[str]) -> bool:
    for task_id in ids:
        body = await worker.get(f"/tasks/{quote(task_id, safe='')}")
        if not (isinstance(body, dict) and "unknown task_id" in body.get("error", "")):
            return False
    return True
