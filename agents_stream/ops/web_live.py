"""The console's live views: ``GET /samples`` (the charts) and ``GET /recent`` (the recent tasks and jobs).

Both are gathered from every worker of the group like ``/approvals`` (agents_stream.ops.routing): the worker asked
sends its own share plus the others', merged; a worker asked by another (the routing header) sends its own only.
Both read memory only (agents_stream.ops.samples, agents_stream.ops.recent) and need the read token like every
other read of task data (agents_stream.ops.access). Schemas: docs/web.md.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from faust.web import Request, Response, View

from agents_stream.ops import api_models as api
from agents_stream.ops.pages import limit_of
from agents_stream.ops.recent import merge_recent
from agents_stream.ops.routing import ROUTED_HEADER, forwarded_headers, gather
from agents_stream.ops.samples import Sample, merge

if TYPE_CHECKING:
    from agents_stream.ops.web import Worker

__all__ = ["RECENT_LIMIT", "register_live_views"]

log = logging.getLogger(__name__)

#: (default, largest) number of tasks, and of jobs, in GET /recent
RECENT_LIMIT = (50, 1000)


def _their_samples(body: Any) -> tuple[str, list[Sample]] | None:
    """Another worker's share of /samples, or None (logged) when it is not one: a worker of another version."""
    try:
        return str(body["worker"]), [Sample.from_json(s) for s in body["samples"]]
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("A worker answered /samples with something else (%r); its samples are left out of the charts "
                    "until it runs this version", exc)
        return None


def register_live_views(app: Any, runtime: Worker) -> None:
    settings = runtime.settings

    @app.page("/samples")
    class Samples(View):
        async def get(self, request: Request) -> Response:
            """The last minutes of every worker's samples on one time grid (``AGENTS_STREAM_CONSOLE_SAMPLE_S``)."""
            own = runtime.samples.samples()
            if request.headers.get(ROUTED_HEADER):
                return self.json({"worker": runtime.worker_id, "samples": [s.to_json() for s in own]})
            bodies, missing = await gather(app, request.rel_url.raw_path_qs, forwarded_headers(request))
            shares = [(runtime.worker_id, own)] + [s for s in map(_their_samples, bodies) if s is not None]
            merged = merge([samples for _, samples in shares], settings.console_sample_s, settings.console_history_s,
                           time.time())
            return self.json(api.answer(
                api.SamplesView, worker=runtime.worker_id, interval_s=settings.console_sample_s,
                history_s=settings.console_history_s, **merged,
                workers=sorted(worker for worker, _ in shares), unreachable=missing,
            ))

    @app.page("/recent")
    class RecentView(View):
        async def get(self, request: Request) -> Response:
            """The tasks and the jobs whose state changed last on every worker, newest first, ``limit`` of each."""
            try:
                limit = limit_of(request.query, *RECENT_LIMIT)
            except ValueError as exc:
                return self.json({"error": f"bad parameter: {exc}"}, status=400)
            ledger = runtime.ledger
            tasks = ledger.recent.newest(limit)
            for entry in tasks:
                entry["worker"] = runtime.worker_id
                run = runtime.executor.runs.get(entry["task_id"])
                entry["held"] = bool(run is not None and run.held and entry["state"] == "running")
            jobs = ledger.orchestrator.recent.newest(limit) if ledger.orchestrator is not None else []
            for entry in jobs:
                entry["worker"] = runtime.worker_id
            if request.headers.get(ROUTED_HEADER):
                return self.json({"worker": runtime.worker_id, "tasks": tasks, "jobs": jobs})
            bodies, missing = await gather(app, request.rel_url.raw_path_qs, forwarded_headers(request))
            theirs = [b for b in bodies if isinstance(b, dict)]
            return self.json(api.answer(
                api.RecentView, worker=runtime.worker_id,
                tasks=merge_recent([tasks, *(_list(b, "tasks") for b in theirs)], "task_id", limit),
                jobs=merge_recent([jobs, *(_list(b, "jobs") for b in theirs)], "job_id", limit),
                unreachable=missing,
            ))


def _list(body: dict[str, Any], name: str) -> list[Any]:
    value = body.get(name)
    return value if isinstance(value, list) else []
