"""A real LiteLLM proxy process for the integration tests: its own venv, a config of mock answers, stopped by PID.

The venv is made by ``scripts/litellm.sh`` (``make test`` runs it): litellm[proxy] never enters the worker's venv.
The environment keeps LiteLLM offline: the model price map is its packaged copy, tiktoken's encodings are the
ones litellm ships, Hugging Face lookups fail at once, and no ``.env`` file is read.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from multidict import CIMultiDict

from .harness import ROOT, free_port

VENV = ROOT / ".data" / "litellm-venv"
CONFIG = Path(__file__).with_name("litellm_config.yaml")

#: what keeps LiteLLM off the network (docs/decisions.md, "LiteLLM as a provider": what it would fetch)
OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # the packaged price map, not the one on GitHub
    "HF_HUB_OFFLINE": "1",  # a Hugging Face tokenizer lookup fails at once instead of waiting on the network
    "LITELLM_MODE": "PRODUCTION",  # DEV (the default) loads a .env file found from the working directory up
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",  # the packaged table an Anthropic model would fetch (none here)
}


class LiteLLMProxy:
    """``litellm --config litellm_config.yaml`` on a free port of 127.0.0.1, with a fresh master key."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.key = f"sk-{uuid.uuid4().hex}"
        self.log_path = workdir / "litellm.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LiteLLMProxy:
        binary = VENV / "bin" / "litellm"
        if not binary.exists():
            raise AssertionError(f"{binary} is missing: run `bash scripts/litellm.sh` (make test runs it)")
        # only what LiteLLM needs: no provider key of the caller's environment reaches it
        env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
        env.update(OFFLINE_ENV, LITELLM_MASTER_KEY=self.key, PYTHONUNBUFFERED="1")
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(binary), "--config", str(CONFIG), "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=self.workdir, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        return self

    async def wait_ready(self, timeout: float = 90.0) -> float:
        """Seconds from now until /health/liveliness answers 200 (its import alone takes ~13 s of CPU)."""
        started = time.monotonic()
        deadline = started + timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    raise AssertionError(f"litellm exited with {self.proc.returncode}:\n{self.tail()}")
                try:
                    async with session.get(f"{self.url}/health/liveliness",
                                           timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            return time.monotonic() - started
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
                await asyncio.sleep(0.25)
        raise AssertionError(f"litellm not ready after {timeout}s:\n{self.tail()}")

    async def chat(self, model: str, text: str = "hi") -> tuple[int, CIMultiDict[str], dict[str, Any]]:
        """One chat completion as any client sends it (curl's view): status, headers (any case), body."""
        body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 16}
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{self.url}/v1/chat/completions", json=body,
                                    headers={"Authorization": f"Bearer {self.key}"},
                                    timeout=aiohttp.ClientTimeout(total=15)) as r:
                return r.status, r.headers.copy(), await r.json(content_type=None)

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return "(no log)"

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM to its process group (uvicorn and anything it started), SIGKILL if it lingers; by PID only."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=timeout)
        if self._log is not None:
            self._log.close()
            self._log = None
