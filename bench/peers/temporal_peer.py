"""Temporal: the CLI's dev server (built from the Go module proxy; `temporal server start-dev --headless`, its
frontend, HTTP and metrics ports picked free, history in a SQLite file in the run's temp dir, so the server keeps
what it acknowledged on disk as the other peers do), a worker process and a gateway process
(bench/peers/temporal_app.py). Each task is one ``POST /task/<id>`` to the gateway, which starts workflow <id> and
answers with its result; the worker is what is measured and SIGKILLed. Concurrency: the SDK's defaults, 100
activity slots and 100 workflow-task slots.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from bench import common
from bench.peers import load, procs, versions


class Temporal:
    name = "Temporal"
    concurrency = "100 activity slots (the Python SDK's default)"
    throughput_n = 400  # its dev server does 7-30 tasks/s here: 1,000 would take minutes

    def __init__(self, on_disk: bool = True) -> None:
        self.on_disk = on_disk  # False: the dev server's default, SQLite in memory
        if not on_disk:
            self.name = "Temporal (SQLite in memory)"
        self.server: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None
        self.gateway: subprocess.Popen | None = None

    async def start(self, tmp: Path, llm_url: str) -> None:
        frontend, http_port, metrics, ui = (procs.free_port() for _ in range(4))
        log = tmp / "temporal-server.log"
        self.server = procs.spawn(
            [str(versions.TEMPORAL_BIN), "server", "start-dev", "--headless", "--ip", "127.0.0.1",
             "--port", str(frontend), "--http-port", str(http_port), "--metrics-port", str(metrics),
             "--ui-port", str(ui), *(["--db-filename", str(tmp / "temporal.db")] if self.on_disk else []),
             "--log-level", "warn"], log)
        # the HTTP API answers once the frontend serves the default namespace
        await procs.wait_http(f"http://127.0.0.1:{http_port}/api/v1/namespaces/default", self.server, log,
                              timeout=120)
        self.env = {"TEMPORAL_ADDRESS": f"127.0.0.1:{frontend}", "BENCH_LLM_URL": llm_url}
        self.log = tmp / "temporal-worker.log"
        self.worker = procs.spawn_app("temporal_app", self.log, "worker", **self.env)
        self.port, glog = procs.free_port(), tmp / "temporal-gateway.log"
        self.gateway = procs.spawn_app("temporal_app", glog, "gateway", str(self.port), **self.env)
        await procs.wait_http(f"http://127.0.0.1:{self.port}/health", self.gateway, glog, timeout=90)

    async def run_tasks(self, ids: list[str], rate: float | None, timeout: float) -> tuple[dict, dict]:
        return await load.http_run(load.task_gateway(self.port), ids, rate, timeout)

    def worker_pid(self) -> int:
        assert self.worker is not None
        return self.worker.pid

    def server_pids(self) -> list[int]:
        return [self.server.pid] if self.server else []

    async def kill_and_restart(self) -> None:
        common.stop(self.worker, sig=signal.SIGKILL)
        self.worker = procs.spawn_app("temporal_app", self.log, "worker", **self.env)

    async def stop(self) -> None:
        common.stop(self.gateway)
        common.stop(self.worker)
        common.stop(self.server)
