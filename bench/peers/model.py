"""The one model call of every peer's worker: an OpenAI chat completion to the fake LLM, tagged as ours is.

Imported by the peers' workers, which run in .data/peers/venv: it needs only aiohttp (async) or the standard
library (sync). The prompt starts ``[task_id=<id>]`` like agents-stream's, so the fake LLM records which task
each call was for (bench/peers/load.py counts the calls per task from its ``/_admin/requests``).
"""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Any

URL = os.environ.get("BENCH_LLM_URL", "http://127.0.0.1:8089")
TIMEOUT_S = 10.0  # as the harness's fake provider (timeout_s = 10)


def body(task_id: str, instruction: str) -> bytes:
    return json.dumps({"model": "fake-model", "max_tokens": 64, "messages": [
        {"role": "user", "content": f"[task_id={task_id}]\n{instruction}"}]}).encode()


def answer(data: dict[str, Any]) -> str:
    return data["choices"][0]["message"]["content"]


async def acall(session: Any, task_id: str, instruction: str) -> str:
    """One call with an aiohttp ``session``; raises on a non-2xx answer (the peer's retry policy decides)."""
    async with session.post(f"{URL}/v1/chat/completions", data=body(task_id, instruction),
                            headers={"Content-Type": "application/json"}) as r:
        r.raise_for_status()
        return answer(await r.json())


def call(task_id: str, instruction: str) -> str:
    """The same call, blocking (Quix Streams processes one message at a time, synchronously)."""
    req = urllib.request.Request(f"{URL}/v1/chat/completions", data=body(task_id, instruction),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
        return answer(json.loads(r.read()))
