"""Restate: its server (from the npm registry; ingress, admin and node ports picked free, data in the run's temp
dir) and one Python service process (bench/peers/restate_app.py) registered as its deployment. Each task is one
request to the ingress, ``POST /Task/run`` with ``idempotency-key: <task id>``, answered with the handler's result
once it is stored; the service process is the worker that is measured and SIGKILLed (the server retries its
invocations once it is back, on the same port). Concurrency: Restate's default, no limit per service; the server's
invoker runs up to 1,000 invocations at once, so the 256 open requests of the driver are the bound.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import aiohttp

from bench import common
from bench.peers import load, procs, versions


class Restate:
    throughput_n = None

    def __init__(self, open_requests: int = load.OPEN_REQUESTS) -> None:
        """``open_requests``: what the driver keeps open in (a), the bound of Restate's concurrency here (64: the
        same as agents-stream's default call slots)."""
        self.open_requests = open_requests
        self.name = "Restate" if open_requests == load.OPEN_REQUESTS else f"Restate, {open_requests} open requests"
        self.concurrency = f"no per-service limit (invoker 1,000): the driver's {open_requests} open requests"
        self.server: subprocess.Popen | None = None
        self.service: subprocess.Popen | None = None

    async def start(self, tmp: Path, llm_url: str) -> None:
        self.ingress, admin, node = procs.free_port(), procs.free_port(), procs.free_port()
        log = tmp / "restate-server.log"
        self.server = procs.spawn(
            [str(versions.RESTATE_BIN), "--no-logo", "--base-dir", str(common.subdir(tmp, "restate"))], log,
            RESTATE_DISABLE_TELEMETRY="true", RESTATE_LISTEN_MODE="tcp",
            RESTATE_INGRESS__BIND_ADDRESS=f"127.0.0.1:{self.ingress}", RESTATE_ADMIN__BIND_ADDRESS=f"127.0.0.1:{admin}",
            RESTATE_BIND_ADDRESS=f"127.0.0.1:{node}", RESTATE_ADVERTISED_ADDRESS=f"http://127.0.0.1:{node}/")
        await procs.wait_http(f"http://127.0.0.1:{admin}/health", self.server, log, timeout=90)
        await procs.wait_http(f"http://127.0.0.1:{self.ingress}/restate/health", self.server, log, timeout=90)
        self.port, self.llm_url, self.log = procs.free_port(), llm_url, tmp / "restate-service.log"
        self.service = procs.spawn_app("restate_app", self.log, str(self.port), BENCH_LLM_URL=llm_url)
        await procs.wait_http(f"http://127.0.0.1:{self.port}/health", self.service, self.log)
        async with aiohttp.ClientSession() as http, http.post(
                f"http://127.0.0.1:{admin}/deployments", json={"uri": f"http://127.0.0.1:{self.port}"}) as r:
            if r.status >= 300:
                raise RuntimeError(f"Restate refused the deployment: {r.status} {await r.text()}")

    async def _post(self, http: aiohttp.ClientSession, task_id: str, body: bytes) -> None:
        async with http.post(f"http://127.0.0.1:{self.ingress}/Task/run", data=body,
                             headers={"content-type": "application/json", "idempotency-key": task_id}) as r:
            r.raise_for_status()
            if json.loads(await r.read()).get("task_id") != task_id:
                raise RuntimeError(f"Restate answered another task for {task_id}")

    async def run_tasks(self, ids: list[str], rate: float | None, timeout: float) -> tuple[dict, dict]:
        return await load.http_run(self._post, ids, rate, timeout, limit=self.open_requests)

    def worker_pid(self) -> int:
        assert self.service is not None
        return self.service.pid

    def server_pids(self) -> list[int]:
        return [self.server.pid] if self.server else []

    async def kill_and_restart(self) -> None:
        common.stop(self.service, sig=signal.SIGKILL)
        self.service = procs.spawn_app("restate_app", self.log, str(self.port), BENCH_LLM_URL=self.llm_url)

    async def stop(self) -> None:
        common.stop(self.service)
        common.stop(self.server)
