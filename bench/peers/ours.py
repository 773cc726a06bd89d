"""agents-stream as the peers see it: one worker (product defaults, the fake LLM as an OpenAI provider), as B2 and B3
start it; tasks published to its task topic, results read off ``agent.results``. The SIGKILL restarts the worker
as a StatefulSet restarts a pod: the same name, data dir and address, and the same static membership id
(AGENTS_STREAM_INSTANCE_ID), so the new process takes the killed one's place in the group at once instead of
waiting for its session to expire (docs/security.md, "Fencing": its
"Takeover in seconds").
"""

from __future__ import annotations

from pathlib import Path

from bench import common
from bench.common import PRODUCT_DEFAULTS, Watch, flow_ready, publish_all, publish_paced, unique
from tests.integration.harness import Cluster


class Ours:
    name = "agents-stream"
    concurrency = "64 call slots (AGENTS_STREAM_MAX_IN_FLIGHT, the default)"
    throughput_n = None

    def __init__(self, **settings: str) -> None:
        self.settings = settings
        if "AGENTS_STREAM_MAX_IN_FLIGHT" in settings:
            slots = settings["AGENTS_STREAM_MAX_IN_FLIGHT"]
            self.name, self.concurrency = f"agents-stream, {slots} slots", f"{slots} call slots (the driver's bound)"
        self.cluster: Cluster | None = None
        self.out: Watch | None = None

    async def start(self, tmp: Path, llm_url: str) -> None:
        self.agent = unique("peers")
        self.topic = f"agent.tasks.{self.agent}"
        self.cluster = Cluster(common.subdir(tmp, "cluster"), [self.agent], llm_url,
                               settings={**PRODUCT_DEFAULTS, "AGENTS_STREAM_INSTANCE_ID": "w0", **self.settings})
        self.worker = common.track(self.cluster.worker("w0").start())
        await self.worker.wait_ready(timeout=120)
        self.out = await Watch("agent.results").start()
        await flow_ready(self.topic, self.out, self.agent)

    async def run_tasks(self, ids: list[str], rate: float | None, timeout: float) -> tuple[dict, dict]:
        assert self.out is not None
        sent: dict[str, float] = {}
        if rate is None:
            await publish_all(self.topic, self.agent, ids, sent)
        else:
            await publish_paced(self.topic, self.agent, ids, rate, sent)
        await self.out.wait_all(ids, timeout)
        return sent, {i: self.out.seen[i] for i in ids if i in self.out.seen}

    def worker_pid(self) -> int:
        return self.worker.proc.pid

    def server_pids(self) -> list[int]:
        return []  # the Kafka broker, shared with Quix Streams: not counted

    async def kill_and_restart(self) -> None:
        assert self.cluster is not None
        port = self.worker.env["WEB_PORT"]
        self.worker.kill()
        self.worker = common.track(self.cluster.worker("w0", WEB_PORT=port).start())

    async def stop(self) -> None:
        if self.out is not None:
            await self.out.stop()
        if self.cluster is not None:
            self.cluster.close()
