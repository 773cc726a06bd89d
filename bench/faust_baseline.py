"""Bare Faust baselines for B1, run as ``python -m faust -A bench.faust_baseline worker``.

BENCH_MODE=passthrough: one agent, consume BENCH_IN → produce BENCH_OUT (one hop, no table).
BENCH_MODE=shaped: the worker's shape without its logic — one agent owning one RocksDB table consumes
BENCH_IN and BENCH_MID; an input record is written to the table and forwarded to BENCH_MID (the ledger's
lease write and the executor's outcome event), the BENCH_MID record is written to the table again and
produced to BENCH_OUT (the ledger's result write and the result). Two Faust hops, one table write per hop.
Same producer settings as the worker (acks=all, linger 1 ms) and the same RocksDB options.
"""

from __future__ import annotations

import json
import os

import faust

MODE = os.environ.get("BENCH_MODE", "passthrough")
IN, OUT, MID = os.environ["BENCH_IN"], os.environ["BENCH_OUT"], os.environ.get("BENCH_MID", "")
PARTITIONS = int(os.environ.get("BENCH_PARTITIONS", "8"))

app = faust.App(
    os.environ["BENCH_APP_ID"],
    broker=os.environ["KAFKA_BROKER"],
    store="rocksdb://" if MODE == "shaped" else "memory://",
    datadir=os.environ["BENCH_DATA_DIR"],
    topic_partitions=PARTITIONS,
    topic_replication_factor=1,
    key_serializer="raw",
    value_serializer="raw",
    web_enabled=False,
    producer_acks=-1,
    producer_linger_ms=1,
    stream_buffer_maxsize=512,
    consumer_auto_offset_reset="earliest",
    loghandlers=[],
)
out_topic = app.topic(OUT, partitions=PARTITIONS, key_serializer="raw", value_serializer="raw")

if MODE == "passthrough":

    @app.agent(app.topic(IN, partitions=PARTITIONS, key_serializer="raw", value_serializer="raw"))
    async def passthrough(stream):  # type: ignore[no-untyped-def]
        async for event in stream.events():
            await out_topic.send(key=event.key, value=event.value)

else:
    records = app.Table(
        "records", default=None, partitions=PARTITIONS,
        schema=faust.Schema(key_type=str, key_serializer="raw", value_serializer="json"),
        options={"driver": "rocksdict", "block_cache_size": 8 * 1024 * 1024, "write_buffer_size": 4 * 1024 * 1024,
                 "max_write_buffer_number": 2},
    )
    mid_topic = app.topic(MID, partitions=PARTITIONS, key_serializer="raw", value_serializer="raw")
    both = app.topic(IN, MID, partitions=PARTITIONS, key_serializer="raw", value_serializer="raw")

    @app.agent(both, concurrency=1)
    async def ledger(stream):  # type: ignore[no-untyped-def]
        async for event in stream.events():
            key = event.key.decode()
            if event.message.topic == IN:
                records[key] = {"state": "running", "payload": event.value.decode(), "v": 1}
                await mid_topic.send(key=event.key, value=json.dumps({"kind": "succeeded"}).encode())
            else:
                old = records.get(key) or {}
                records[key] = {**old, "state": "succeeded", "result": event.value.decode()}
                await out_topic.send(key=event.key, value=event.value)
