"""Quix Streams (bench/peers/quix_app.py) on the project's Kafka broker, driven as ours is: tasks published to its
input topic (8 partitions), results read off its output topic. Quix Streams calls a processing function for one
message at a time, synchronously, and scales by partitions and processes: concurrency 1 per process.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from bench import common
from bench.common import Watch, create_topics, flow_ready, publish_all, publish_paced, unique
from bench.peers import procs


class Quix:
    name = "Quix Streams"
    concurrency = "1 message at a time (synchronous; scales by partitions × processes)"
    throughput_n = 40  # 5 tasks/s at 200 ms: 8 s

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.out: Watch | None = None

    async def start(self, tmp: Path, llm_url: str) -> None:
        run = unique("peers-quix")
        self.topic, out_topic = f"{run}.in", f"{run}.out"
        await create_topics([self.topic, out_topic])
        self.env = {"BENCH_IN": self.topic, "BENCH_OUT": out_topic, "BENCH_GROUP": run, "BENCH_LLM_URL": llm_url,
                    "BENCH_STATE_DIR": str(common.subdir(tmp, "quix-state")), "KAFKA_BOOTSTRAP": common.BOOTSTRAP}
        self.log = tmp / f"{run}.log"
        self.proc = procs.spawn_app("quix_app", self.log, **self.env)
        self.out = await Watch(out_topic).start()
        await flow_ready(self.topic, self.out, "bench")

    async def run_tasks(self, ids: list[str], rate: float | None, timeout: float) -> tuple[dict, dict]:
        assert self.out is not None
        sent: dict[str, float] = {}
        if rate is None:
            await publish_all(self.topic, "bench", ids, sent)
        else:
            await publish_paced(self.topic, "bench", ids, rate, sent)
        await self.out.wait_all(ids, timeout)
        return sent, {i: self.out.seen[i] for i in ids if i in self.out.seen}

    def worker_pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def server_pids(self) -> list[int]:
        return []  # the Kafka broker, shared with ours: not counted

    async def kill_and_restart(self) -> None:
        common.stop(self.proc, sig=signal.SIGKILL)
        self.proc = procs.spawn_app("quix_app", self.log, **self.env)

    async def stop(self) -> None:
        if self.out is not None:
            await self.out.stop()
        common.stop(self.proc)
