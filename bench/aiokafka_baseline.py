"""Raw aiokafka consume → produce loop (the B1 baseline with no framework): at-least-once, batches of
up to 500 records, each batch's sends confirmed before its offsets are committed.

Usage: python bench/aiokafka_baseline.py BOOTSTRAP IN_TOPIC OUT_TOPIC GROUP
"""

from __future__ import annotations

import asyncio
import signal
import sys

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer


async def main(bootstrap: str, src: str, dst: str, group: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    consumer = AIOKafkaConsumer(src, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=1)
    await asyncio.wait_for(consumer.start(), 30)
    await asyncio.wait_for(producer.start(), 30)
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100, max_records=500)
            futs = [await producer.send(dst, m.value, key=m.key) for msgs in batch.values() for m in msgs]
            if futs:
                await asyncio.wait_for(asyncio.gather(*futs), 30)
                await asyncio.wait_for(consumer.commit(), 30)
    finally:
        await producer.stop()
        await consumer.stop()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
