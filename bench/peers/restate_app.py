"""The Restate peer's service (runs in .data/peers/venv): one handler per task, ``Task/run``; the caller's
idempotency key is the task id, and the model call is journaled in ``ctx.run``, so a retried invocation replays
the call's result instead of calling again, once the call has finished. Served by hypercorn (HTTP/2, as Restate's
Python docs serve it).

    BENCH_LLM_URL=<fake> python -m bench.peers.restate_app <port>
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import aiohttp
import hypercorn.asyncio
import hypercorn.config
import restate

from bench.peers import model

task = restate.Service("Task")
_http: aiohttp.ClientSession | None = None


async def _call(task_id: str, instruction: str) -> str:
    global _http
    if _http is None:
        _http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                      timeout=aiohttp.ClientTimeout(total=model.TIMEOUT_S))
    return await model.acall(_http, task_id, instruction)


@task.handler()
async def run(ctx: restate.Context, req: dict[str, Any]) -> dict[str, Any]:
    output = await ctx.run_typed("model", _call, task_id=req["task_id"], instruction=req["instruction"])
    return {"task_id": req["task_id"], "status": "succeeded", "output": output}


def main() -> None:
    config = hypercorn.config.Config()
    config.bind = [f"127.0.0.1:{sys.argv[1]}"]
    config.loglevel = "WARNING"
    asyncio.run(hypercorn.asyncio.serve(restate.app(services=[task]), config))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
