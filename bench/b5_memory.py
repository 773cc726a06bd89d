"""B5: resident memory of one worker whose task table holds N finished task records.

The records are written straight to the table's changelog topic (``<app id>-tasks-changelog``, compacted,
8 partitions, each key on its task's partition as Faust places it) in the table's own format (the key a
JSON string, as read back from a changelog the worker itself wrote; the value compact JSON): a
TaskRecord built with tables/leases.py (state succeeded, a ~150-byte payload, the stored TaskResult JSON
the ledger would keep), serialised as the ledger's table does (``to_json()`` as JSON). Then a worker of that
app id starts, recovers the table into RocksDB (its web port opens only once recovery is done), and its
VmRSS and VmHWM (peak) are read from /proc/<pid>/status. A worker of a fresh app id (empty table) is
measured the same way for reference. A sample of keys is read back through GET /tasks/{task_id}.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from agents_stream.tables.leases import SUCCEEDED, TaskRecord
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from agents_stream.contract.models import TaskResult, Usage
from bench import common
from bench.common import BOOTSTRAP, PARTITIONS, PRODUCT_DEFAULTS, partition_of, proc_status, unique
from bench.report import Row
from tests.integration.harness import Cluster

TARGET_MB = 300


def record_bytes(agent: str, task_id: str, i: int, now: float) -> bytes:
    payload = common.task_body(agent, task_id, i).decode()
    result = TaskResult(
        task_id=task_id, agent_name=agent, status="succeeded",
        output=f"[local:local] count the words of sentence {i} #{i:012x}", confidence="high",
        source="primary:local:local", attempts=1, usage=Usage(input_tokens=12, output_tokens=9),
        completed_at="2026-11-30T02:00:00.000000Z",
    ).model_dump_json()
    rec = TaskRecord(
        state=SUCCEEDED, agent=agent, dispatch=1, owner="bench-host:12345:0123abcd", lease_until=now + 30,
        payload=payload, topic=f"agent.tasks.{agent}", partition=partition_of(task_id), offset=i // PARTITIONS,
        received_at=now, result=result, finished_at=now + 0.01,
    )
    return json.dumps(rec.to_json(), separators=(",", ":")).encode()


async def load_changelog(topic: str, agent: str, n: int) -> tuple[list[str], float, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    await asyncio.wait_for(admin.start(), 30)
    try:
        await asyncio.wait_for(admin.create_topics([NewTopic(topic, PARTITIONS, 1,
                                                             topic_configs={"cleanup.policy": "compact"})]), 30)
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all", linger_ms=20, max_batch_size=512 * 1024)
    await asyncio.wait_for(producer.start(), 30)
    run = unique("b5")
    sample: list[str] = []
    started, now, size = time.monotonic(), time.time(), 0
    try:
        futs = []
        for i in range(n):
            task_id = f"{run}-{i}"
            value = record_bytes(agent, task_id, i, now)
            size += len(value)
            # the key as the table writes it (a JSON string), on the partition of the task's raw key
            key = json.dumps(task_id).encode()
            futs.append(await producer.send(topic, value, key=key, partition=partition_of(task_id)))
            if len(futs) >= 20_000:
                await asyncio.wait_for(asyncio.gather(*futs), 120)
                futs = []
            if i % max(1, n // 5) == 0:
                sample.append(task_id)
        await asyncio.wait_for(asyncio.gather(*futs), 120)
    finally:
        await producer.stop()
    return sample, time.monotonic() - started, size


async def _delete_topic(topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    try:
        await asyncio.wait_for(admin.start(), 30)
        await asyncio.wait_for(admin.delete_topics([topic]), 30)
    except Exception as exc:  # best effort: a leftover topic costs disk, not correctness
        print(f"could not delete {topic}: {exc!r}", file=sys.stderr)
    finally:
        await admin.close()


async def _rss_after_ready(worker: Any, timeout: float) -> dict[str, Any]:
    started = time.monotonic()
    await worker.wait_ready(timeout=timeout)
    ready = time.monotonic() - started
    await asyncio.sleep(5)  # let the start finish (timers, first presence event)
    st = proc_status(worker.proc.pid)
    return {"ready_s": ready, "rss": st["VmRSS"], "hwm": st["VmHWM"]}


async def run(tmp: Path, n: int) -> tuple[list[Row], dict[str, Any]]:
    agent = unique("b5")
    mb = lambda b: f"{b / 1024 / 1024:,.0f} MB"  # noqa: E731
    # reference: an empty table
    empty = Cluster(common.subdir(tmp, "empty"), [agent], None, settings=dict(PRODUCT_DEFAULTS))
    w = common.track(empty.worker("empty").start())
    try:
        ref = await _rss_after_ready(w, 120)
    finally:
        empty.close()
    full = Cluster(common.subdir(tmp, "full"), [agent], None, settings=dict(PRODUCT_DEFAULTS))
    sample, load_s, size = await load_changelog(f"{full.app_id}-tasks-changelog", agent, n)
    w = common.track(full.worker("full").start())
    try:
        got = await _rss_after_ready(w, 900)
        found = 0
        for task_id in sample:
            body = await w.get(f"/tasks/{task_id}")
            found += isinstance(body, dict) and body.get("state") == "succeeded"
    except Exception:
        print(w.tail(), file=sys.stderr)
        raise
    finally:
        full.close()
        await _delete_topic(f"{full.app_id}-tasks-changelog")  # about 1 KB per record: do not leave it on the broker
    res = {"n": n, "load_s": load_s, "changelog_bytes": size, "empty": ref, "full": got,
           "sample_found": found, "sample": len(sample)}
    rows = [
        Row("B5", f"worker RSS, {n:,} task records recovered ({mb(size)} of changelog; peak {mb(got['hwm'])}; "
                  f"recovery+start {got['ready_s']:.0f} s; {found}/{len(sample)} sampled keys read back)",
            mb(got["rss"]), f"≤ {TARGET_MB} MB", got["rss"] <= TARGET_MB * 1024 * 1024),
        Row("B5", "  reference: worker RSS with an empty table", mb(ref["rss"])),
    ]
    return rows, res
