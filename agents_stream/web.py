"""The worker's web views: health, readiness and a task's ledger record (issue 5 adds the rest)."""

from __future__ import annotations

import json
from typing import Any

from faust.web import Request, Response, View

from agents_stream import metrics
from tables.leases import TaskRecord


def register(app: Any) -> None:
    table = app.task_table

    @app.page("/healthz")
    class Healthz(View):
        async def get(self, request: Request) -> Response:
            return self.json({"status": "ok", "worker": app.runtime.worker_id})

    @app.page("/readyz")
    class Readyz(View):
        async def get(self, request: Request) -> Response:
            # The port opens only after table recovery; 503 once shutdown began.
            if app.should_stop:
                return self.json({"status": "stopping"}, status=503)
            if not app.runtime.started:
                return self.json({"status": "starting"}, status=503)
            ex = app.runtime.executor
            return self.json({
                "status": "ready",
                "worker": app.runtime.worker_id,
                "in_flight": ex.running,
                "queued": len(ex.jobs) - ex.running,
                "held": ex.held,
                "providers_down": sorted(p for p in app.runtime.circuits.circuits if not app.runtime.circuits.available(p)[0]),
            })

    @app.page("/metrics")
    class Metrics(View):
        async def get(self, request: Request) -> Response:
            body, content_type = metrics.render(app.runtime.circuits.describe(), app.runtime.executor.held)
            return self.bytes(body, content_type=content_type.split(";")[0])

    @app.page("/circuits")
    class CircuitsView(View):
        async def get(self, request: Request) -> Response:
            # The same on every worker: all fold one log (agents_stream.circuits).
            return self.json({"worker": app.runtime.worker_id, "providers": app.runtime.circuits.describe()})

    @app.page("/tasks/{task_id}")
    @app.table_route(table=table, match_info="task_id")
    async def task(self: View, request: Request, task_id: str) -> Response:
        data = table.get(task_id)
        if not data:
            return self.json({"error": f"unknown task_id {task_id!r}"}, status=404)
        record = TaskRecord.from_json(data)
        body: dict[str, Any] = {
            "task_id": task_id,
            "state": record.state,
            "agent": record.agent,
            "dispatch": record.dispatch,
            "owner": record.owner,
            "lease_until": record.lease_until,
            "source": {"topic": record.topic, "partition": record.partition, "offset": record.offset},
            "result": json.loads(record.result) if record.result else None,
        }
        return self.json(body)
