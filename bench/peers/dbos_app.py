"""The DBOS peer (runs in .data/peers/venv): one workflow per task, workflow id = task id, the model call its one
step, on a PostgreSQL system database; the process serves ``POST /task/<id>`` (aiohttp), which starts the workflow
under that id and answers with its result once it is stored. A second request with the same id attaches to the
workflow that id already has; at launch, DBOS recovers the workflows a killed process left pending.

    BENCH_LLM_URL=<fake> BENCH_DBOS_URL=postgresql://... python -m bench.peers.dbos_app <port>
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import aiohttp
from aiohttp import web
from dbos import DBOS, SetWorkflowID

from bench.peers import model

DBOS(config={"name": "bench_peers", "system_database_url": os.environ["BENCH_DBOS_URL"], "log_level": "WARNING"})
_http: aiohttp.ClientSession | None = None


@DBOS.step()
async def call_model(task_id: str, instruction: str) -> str:
    global _http
    if _http is None:
        _http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                      timeout=aiohttp.ClientTimeout(total=model.TIMEOUT_S))
    return await model.acall(_http, task_id, instruction)


@DBOS.workflow()
async def task(task_id: str, instruction: str) -> dict[str, Any]:
    output = await call_model(task_id, instruction)
    return {"task_id": task_id, "status": "succeeded", "output": output}


async def handle(request: web.Request) -> web.Response:
    body = json.loads(await request.read())
    with SetWorkflowID(request.match_info["task_id"]):
        wf = await DBOS.start_workflow_async(task, body["task_id"], body["instruction"])
    return web.json_response(await wf.get_result())


async def health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def main(port: int) -> None:
    DBOS.launch()
    app = web.Application()
    app.add_routes([web.post("/task/{task_id}", handle), web.get("/health", health)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()  # until SIGTERM/SIGKILL: the process's whole life


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
