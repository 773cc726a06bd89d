"""The peers' processes: their apps run by .data/peers/venv's Python, servers by their own binaries; every one is
registered with bench.common so it is stopped by PID (common.stop_all) whatever happens."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench import common
from bench.peers import versions
from tests.integration.harness import free_port

__all__ = ["free_port", "spawn", "spawn_app", "wait_http", "wait_line"]


def spawn(args: list[str], log: Path, user: str | None = None, **env: str) -> subprocess.Popen:
    """A child process of ours (as ``user`` when given: PostgreSQL refuses to run as root)."""
    out = open(log, "ab")
    proc = subprocess.Popen(args, cwd=common.ROOT, env=common.base_env(**env), stdout=out, stderr=subprocess.STDOUT,
                            user=user, group=user)
    out.close()
    common._PROCS.append(proc)  # stopped by PID in common.stop_all()
    return proc


def spawn_app(module: str, log: Path, *args: str, **env: str) -> subprocess.Popen:
    """``python -m bench.peers.<module>`` in the peers' venv (it imports only bench.peers.model of ours)."""
    return spawn([str(versions.VENV_PYTHON), "-m", f"bench.peers.{module}", *args], log,
                 PYTHONPATH=str(common.ROOT), **env)


async def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60.0, ok: Any = None) -> None:
    """Until ``url`` answers 2xx (or ``ok(status)``); raises with the log's tail if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{log.stem} exited with {proc.returncode}: {common.tail(log, 5)}")
            try:
                async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if (ok or (lambda s: 200 <= s < 300))(r.status):
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass
            await asyncio.sleep(0.3)
    raise RuntimeError(f"{log.stem}: {url} not answering after {timeout:.0f} s: {common.tail(log, 5)}")


async def wait_line(log: Path, text: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in common.tail(log, 400):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{log.stem} exited with {proc.returncode}: {common.tail(log, 5)}")
        await asyncio.sleep(0.3)
    raise RuntimeError(f"{log.stem}: no {text!r} after {timeout:.0f} s: {common.tail(log, 5)}")
