"""DBOS on PostgreSQL 15 (Debian's server): a private cluster made by initdb in a temp dir, on a free port, run as
the ``postgres`` user when we are root (PostgreSQL refuses root); and one DBOS app process (bench/peers/dbos_app.py),
the worker that is measured and SIGKILLed. Each task is one ``POST /task/<id>`` to it, answered once the workflow's
result is stored; a request cut by the kill is sent again (same id) until the restarted process answers.
Concurrency: DBOS runs each workflow started this way at once (no queue, no limit): the driver's 256 open requests
are the bound.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from bench import common
from bench.peers import load, procs, versions


class Dbos:
    name = "DBOS"
    concurrency = "no limit (workflows started directly): the driver's 256 open requests"
    throughput_n = None

    def __init__(self) -> None:
        self.pg: subprocess.Popen | None = None
        self.app: subprocess.Popen | None = None
        self.pgdir: Path | None = None

    async def start(self, tmp: Path, llm_url: str) -> None:
        bindir = versions.POSTGRES[1]
        user = "postgres" if os.geteuid() == 0 else None
        self.pgdir = Path(tempfile.mkdtemp(prefix="peers-pg-"))  # not under tmp: postgres must reach it
        if user:
            shutil.chown(self.pgdir, user, user)
        data, pg_port = self.pgdir / "data", procs.free_port()
        init = subprocess.run([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8"],
                              capture_output=True, text=True, timeout=120, user=user, group=user)
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {(init.stderr or init.stdout).strip().splitlines()[-1:]}")
        log = tmp / "postgres.log"
        self.pg = procs.spawn([str(bindir / "postgres"), "-D", str(data), "-p", str(pg_port), "-k", str(self.pgdir),
                               "-c", "listen_addresses=127.0.0.1"], log, user=user)
        await procs.wait_line(log, "ready to accept connections", self.pg)
        self.port, self.log = procs.free_port(), tmp / "dbos-app.log"
        self.env = {"BENCH_LLM_URL": llm_url,
                    "BENCH_DBOS_URL": f"postgresql://postgres@127.0.0.1:{pg_port}/bench_peers_dbos"}
        await self._start_app()

    async def _start_app(self) -> None:
        self.app = procs.spawn_app("dbos_app", self.log, str(self.port), **self.env)
        await procs.wait_http(f"http://127.0.0.1:{self.port}/health", self.app, self.log, timeout=90)

    async def run_tasks(self, ids: list[str], rate: float | None, timeout: float) -> tuple[dict, dict]:
        return await load.http_run(load.task_gateway(self.port), ids, rate, timeout)

    def worker_pid(self) -> int:
        assert self.app is not None
        return self.app.pid

    def server_pids(self) -> list[int]:
        return [self.pg.pid] if self.pg else []

    async def kill_and_restart(self) -> None:
        common.stop(self.app, sig=signal.SIGKILL)
        await self._start_app()

    async def stop(self) -> None:
        try:
            common.stop(self.app)
            common.stop(self.pg, sig=signal.SIGINT)  # PostgreSQL's fast shutdown
        finally:
            if self.pgdir is not None:
                shutil.rmtree(self.pgdir, ignore_errors=True)
