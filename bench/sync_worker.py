"""The classic synchronous worker (B2 baseline): one message at a time — read it, call the LLM API over
HTTP (OpenAI chat completions, aiohttp, awaited), send the result and wait for the broker, commit, next.

Usage: python bench/sync_worker.py BOOTSTRAP IN_TOPIC OUT_TOPIC GROUP BASE_URL
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import aiohttp
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer


async def main(bootstrap: str, src: str, dst: str, group: str, base_url: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    consumer = AIOKafkaConsumer(src, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                                auto_offset_reset="earliest", max_poll_records=1)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await asyncio.wait_for(consumer.start(), 30)
    await asyncio.wait_for(producer.start(), 30)
    timeout = aiohttp.ClientTimeout(total=10)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=100, max_records=1)
                for msgs in batch.values():
                    for m in msgs:
                        task = json.loads(m.value)
                        body = {"model": "fake-model", "messages": [{"role": "user", "content": task["instruction"]}]}
                        async with http.post(f"{base_url}/v1/chat/completions", json=body) as r:
                            answer = await r.json()
                        result = {"task_id": task["task_id"], "status": "succeeded",
                                  "output": answer["choices"][0]["message"]["content"]}
                        await asyncio.wait_for(await producer.send(dst, json.dumps(result).encode(), key=m.key), 30)
                        await asyncio.wait_for(consumer.commit(), 30)
    finally:
        await producer.stop()
        await consumer.stop()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
