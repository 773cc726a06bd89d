"""One worker, the `local` provider: end-to-end tasks/s (publish all, then time until every result is on agent.results).

Usage: .venv/bin/python bench/throughput_local.py [N]   (needs a broker: make broker)
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.harness import BOOTSTRAP, Cluster, create_topics, unique  # noqa: E402


async def main(n: int) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    agent = unique("bench")
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp), [agent], None, settings={"AGENTS_STREAM_PARTITIONS": "4"})
        worker = cluster.worker().start()
        try:
            await worker.wait_ready()
            topic = f"agent.tasks.{agent}"
            await create_topics([topic])
            ids = [str(uuid.uuid4()) for _ in range(n)]
            consumer = AIOKafkaConsumer("agent.results", bootstrap_servers=BOOTSTRAP, auto_offset_reset="latest")
            await consumer.start()
            await asyncio.sleep(1.0)
            producer = AIOKafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all", linger_ms=5)
            await producer.start()
            started = time.monotonic()
            for task_id in ids:
                body = {"task_id": task_id, "agent_name": agent, "instruction": "count the words", "context_data": {}}
                await producer.send(topic, json.dumps(body).encode(), key=task_id.encode())
            await producer.flush()
            published = time.monotonic() - started
            want, seen = set(ids), set()
            deadline = time.monotonic() + 600
            while seen != want and time.monotonic() < deadline:
                for msgs in (await consumer.getmany(timeout_ms=500)).values():
                    seen.update(m.key.decode() for m in msgs if m.key and m.key.decode() in want)
            took = time.monotonic() - started
            await producer.stop()
            await consumer.stop()
            print(f"local provider, 1 worker, 4 partitions: {len(seen)}/{n} results in {took:.1f}s "
                  f"(publishing took {published:.1f}s) = {len(seen) / took:.0f} tasks/s end to end")
        finally:
            worker.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000))
