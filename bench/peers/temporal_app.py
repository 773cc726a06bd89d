"""The Temporal peer's processes (run in .data/peers/venv): the worker, one workflow per task (workflow id = task
id) whose one activity calls the model, at the Python SDK's default slots (100 activities, 100 workflow tasks) with
the default workflow sandbox; and a gateway, a separate client process serving ``POST /task/<id>``: it starts the
task's workflow (an id already running is attached to; one that finished answers its stored result) and answers
once the result is in the workflow's history.

    TEMPORAL_ADDRESS=host:port python -m bench.peers.temporal_app worker
    TEMPORAL_ADDRESS=host:port python -m bench.peers.temporal_app gateway <port>
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    import aiohttp

    from bench.peers import model

QUEUE = "bench-peers"
_http: aiohttp.ClientSession | None = None


@activity.defn
async def call_model(task_id: str, instruction: str) -> str:
    global _http
    if _http is None:
        _http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                      timeout=aiohttp.ClientTimeout(total=model.TIMEOUT_S))
    return await model.acall(_http, task_id, instruction)


@workflow.defn(name="Task")
class Task:
    @workflow.run
    async def run(self, task_id: str, instruction: str) -> dict[str, Any]:
        # a call cut off by a dead worker is tried again after start_to_close_timeout
        output = await workflow.execute_activity(call_model, args=[task_id, instruction],
                                                 start_to_close_timeout=timedelta(seconds=10))
        return {"task_id": task_id, "status": "succeeded", "output": output}


async def _client() -> Any:
    from temporalio.client import Client

    return await Client.connect(os.environ["TEMPORAL_ADDRESS"])


async def worker() -> None:
    from temporalio.worker import Worker

    await Worker(await _client(), task_queue=QUEUE, workflows=[Task], activities=[call_model]).run()


async def gateway(port: int) -> None:
    from aiohttp import web
    from temporalio.client import WorkflowHandle
    from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
    from temporalio.exceptions import WorkflowAlreadyStartedError

    client = await _client()

    async def handle(request: web.Request) -> web.Response:
        task_id = request.match_info["task_id"]
        body = json.loads(await request.read())
        try:
            wf: WorkflowHandle = await client.start_workflow(
                "Task", args=[task_id, body["instruction"]], id=task_id, task_queue=QUEUE,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING)
        except WorkflowAlreadyStartedError:  # it finished before: its stored result
            wf = client.get_workflow_handle(task_id)
        return web.json_response(await wf.result())

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.add_routes([web.post("/task/{task_id}", handle), web.get("/health", health)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()  # until SIGTERM: the process's whole life


if __name__ == "__main__":
    asyncio.run(worker() if sys.argv[1] == "worker" else gateway(int(sys.argv[2])))
