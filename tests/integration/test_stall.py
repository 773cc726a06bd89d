"""A partition whose fetched records never reached the ledger is read again (the rare Faust stall, docs/decisions.md).

The fault is injected where Faust loses them: records aiokafka has fetched (its
position is past them) are dropped before delivery, so nothing fetches them
again. Without the progress check the task would wait until a restart.
"""

from __future__ import annotations

import json

from agents_stream.contract import topics
from agents_stream.kafka.consumer import FAULT_DROP_FETCHED

from .harness import encode, produce, read_topic, results_for, task, uncommitted, unique


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
    assert await uncommitted(c.app_id, topics.task_topic(agent)) == 0
