"""The worker's web views: health, readiness, metrics, a task's and a job's record, breakers, approvals, dead letters,
the console's samples and recent list (agents_stream.ops.web_live); approvals are agents_stream.ops.web_approvals'.

Reads are answered by whichever worker is asked (table reads are forwarded to the
key's owner, lists are gathered from every worker, a page at a time); reads of task
data need the read or the write token and every view but the probes checks the Host
header (agents_stream.ops.access). Mutations need the write token, arrive as JSON of
at most ``MAX_BODY`` bytes (agents_stream.ops.bodies), are refused from another
origin, and become events on a topic; the worker owning the key applies them.
Schemas: docs/web.md.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Protocol

from faust.web import Request, Response, View

from agents_stream.contract import topics
from agents_stream.contract.models import ApprovalDecision
from agents_stream.execution.agent_loop import transcript
from agents_stream.ops import access, metrics
from agents_stream.ops import api_models as api
from agents_stream.ops.access import Refused, same_origin
from agents_stream.ops.bodies import MAX_BODY, mutation_body
from agents_stream.ops.routing import routed
from agents_stream.ops.samples import SampleRing
from agents_stream.ops.web_approvals import publish_decision, register_approval_views, send_event
from agents_stream.ops.web_conversations import register_conversation_views
from agents_stream.ops.web_desk import register_desk_views
from agents_stream.ops.web_dlq import register_dead_letter_views
from agents_stream.ops.web_events import register_event_views
from agents_stream.ops.web_handoff import register_handoff_views
from agents_stream.ops.web_live import register_live_views
from agents_stream.orchestrator import JobRequest
from agents_stream.settings import Settings
from agents_stream.tables import approvals, route_journal
from agents_stream.tables.definitions import Tables
from agents_stream.tables.leases import TaskRecord, completed_steps

if TYPE_CHECKING:
    from agents_stream.execution.executor import Executor
    from agents_stream.ledger.ledger import Ledger
    from agents_stream.resilience.circuits import Circuits

log = logging.getLogger(__name__)


# Re-exported for the views below and their callers: the body rules live in agents_stream.ops.bodies, the
# approval views and the event sends in agents_stream.ops.web_approvals.
__all__ = [
    "MAX_BODY", "Refused", "Worker", "mutation_body", "publish_decision", "register", "same_origin", "send_event",
]


class Worker(Protocol):
    """What the web views read of the worker they run in (agents_stream.app.Runtime is one)."""

    settings: Settings
    tables: Tables
    worker_id: str
    agents: list[str]
    ready: bool  # output topics declared and executor running
    ledger: Ledger
    executor: Executor
    circuits: Circuits
    samples: SampleRing  # the console's charts (agents_stream.ops.samples)

    def consumer_lag(self) -> dict[str, int]: ...


def register(app: Any, runtime: Worker) -> None:
    """Add the views to ``app``'s web server; they read ``runtime`` (its tables, ledger, executor, circuits)."""
    settings = runtime.settings
    access.check_open_bind(settings)
    # Before any view: the Host check and the read token (agents_stream.ops.access) guard every route.
    app.web.web_app.middlewares.append(access.guard(settings))
    if not (settings.api_token or settings.read_token or settings.api_open):
        log.warning(
            "Neither AGENTS_STREAM_API_TOKEN nor AGENTS_STREAM_READ_TOKEN is set: /tasks, /jobs, /approvals, /dlq, "
            "/circuits, /samples and /recent refuse every request (401); /healthz, /readyz and /metrics still answer. "
            "Set a token to read."
        )
    if runtime.ledger.policies and not settings.api_token and not settings.api_open:
        log.warning(
            "Approvals are configured but AGENTS_STREAM_API_TOKEN is not set: POST /approvals/<task_id> refuses every "
            "request (signed links, the CLI and agent.approvals events still work). Set a token to decide over HTTP."
        )
    if settings.api_open:
        log.warning(
            "AGENTS_STREAM_API_OPEN is set: every web endpoint answers without a token (the web views listen on a "
            "loopback address only). Local demos only."
        )
    # In this order: a fixed path (/dlq/requeue) before the pattern that would match it too (/dlq/{ref}).
    register_approval_views(app, runtime)
    register_dead_letter_views(app, settings)
    register_conversation_views(app, runtime)
    register_handoff_views(app, runtime)
    register_desk_views(app, runtime)
    register_event_views(app, runtime)
    _cancel_views(app, settings)
    _health_views(app, runtime)
    _record_views(app, runtime)
    register_live_views(app, runtime)

    from agents_stream.ops.console import register_console
    from agents_stream.ops.openapi import register_openapi_view

    register_console(app)
    register_openapi_view(app)


def _cancel_views(app: Any, settings: Settings) -> None:
    @app.page("/jobs/{job_id}/cancel")
    class CancelJob(View):
        async def post(self, request: Request, job_id: str) -> Response:
            try:
                body = await mutation_body(settings, request)
                cancel = JobRequest.model_validate(
                    {
                        "job_id": job_id, "action": "cancel", "by": body.get("by") or "http",
                        "reason": body.get("reason") or "",
                    },
                )
            except Refused as exc:
                return self.json({"error": str(exc)}, status=exc.status)
            except Exception as exc:
                expected = '{"by": "<who>", "reason": "<why>"}'
                return self.json({"error": f"expected JSON {expected}: {exc}"}, status=400)
            try:
                await send_event(app, topics.JOBS, job_id, cancel.model_dump_json(exclude_none=True).encode())
            except Refused as exc:
                return self.json({"error": str(exc)}, status=exc.status)
            return self.json(api.answer(api.JobCancelAccepted, accepted=True, job_id=job_id, by=cancel.by), status=202)


    @app.page("/tasks/{task_id}/cancel")
    class CancelTask(View):
        async def post(self, request: Request, task_id: str) -> Response:
            """Cancel a task (running, parked, waiting for sub-tasks); ``agent`` also stops one not read yet."""
            try:
                body = await mutation_body(settings, request)
                decision = ApprovalDecision.model_validate({  # for this app id's task (ledger/cancel_decisions.py)
                    "task_id": task_id, "decision": "cancel", "by": body.get("by") or "http", "via": "http",
                    "comment": body.get("reason") or None, "agent": body.get("agent") or None,
                    "app_id": settings.app_id,
                })
            except Refused as exc:
                return self.json({"error": str(exc)}, status=exc.status)
            except Exception as exc:  # bad fields (control characters too): the caller's mistake, said plainly
                expected = '{"by": "<who>", "reason": "<why>", "agent": "<its agent, optional>"}'
                return self.json({"error": f"expected JSON {expected}: {exc}"}, status=400)
            try:
                await publish_decision(app, decision, settings.approval_secret)
            except Refused as exc:
                return self.json({"error": str(exc)}, status=exc.status)
            accepted = api.answer(api.TaskCancelAccepted, accepted=True, task_id=task_id, by=decision.by)
            return self.json(accepted, status=202)


def _health_views(app: Any, runtime: Worker) -> None:
    @app.page("/healthz")
    class Healthz(View):
        async def get(self, request: Request) -> Response:
            return self.json(api.answer(api.Health, status="ok", worker=runtime.worker_id))

    @app.page("/readyz")
    class Readyz(View):
        async def get(self, request: Request) -> Response:
            # The port opens only after table recovery; 503 once shutdown began.
            if app.should_stop:
                return self.json(api.answer(api.NotReady, status="stopping"), status=503)
            if not runtime.ready:
                return self.json(api.answer(api.NotReady, status="starting"), status=503)
            ex = runtime.executor
            return self.json(api.answer(
                api.Ready, status="ready", worker=runtime.worker_id, in_flight=ex.running,
                queued=len(ex.runs) - ex.running, held=ex.held, providers_down=runtime.circuits.providers_down(),
            ))

    @app.page("/metrics")
    class Metrics(View):
        async def get(self, request: Request) -> Response:
            # Only this worker's own numbers, from memory: Prometheus scrapes every worker and sums.
            rt = runtime
            body, content_type = metrics.render(
                rt.circuits.describe(), rt.executor.held, agents=rt.agents, leases_now=len(rt.ledger.open_tasks),
                approvals=rt.ledger.approvals_pending(rt.agents), lag=rt.consumer_lag(),
            )
            return self.bytes(body, content_type=content_type.split(";")[0])

    @app.page("/circuits")
    class CircuitsView(View):
        async def get(self, request: Request) -> Response:
            # The same on every worker: all fold one log (agents_stream.resilience.circuits).
            described = runtime.circuits.describe()
            return self.json(api.answer(api.CircuitsView, worker=runtime.worker_id, providers=described))


def _record_views(app: Any, runtime: Worker) -> None:
    """A task's and a job's record, answered by the worker owning the key."""
    table = runtime.tables.tasks
    settings = runtime.settings
    orchestrator = runtime.ledger.orchestrator
    if orchestrator is not None:

        @app.page("/jobs/{job_id}")
        @routed(app, runtime.tables.jobs, "job_id", settings.partitions)
        async def job(self: View, request: Request, job_id: str) -> Response:
            body = orchestrator.describe(job_id)
            if body is None:
                return self.json({"error": f"unknown job_id {job_id!r}"}, status=404)
            return self.json(api.answer(api.JobView, **body))

    @app.page("/tasks/{task_id}")
    @routed(app, table, "task_id", settings.partitions)
    async def task(self: View, request: Request, task_id: str) -> Response:
        data = table.get(task_id)
        if not data:
            return self.json({"error": f"unknown task_id {task_id!r}"}, status=404)
        record = TaskRecord.from_json(data)
        body: dict[str, Any] = {
            "task_id": task_id,
            "app_id": settings.app_id,
            "state": record.state,
            "agent": record.agent,
            "dispatch": record.dispatch,
            "owner": record.owner,
            "lease_until": record.lease_until,
            "source": {"topic": record.topic, "partition": record.partition, "offset": record.offset},
            "result": json.loads(record.result) if record.result else None,
            # with its parking (``parked``): what a decision on it names (ops/web_approvals.py)
            "approval": {**json.loads(record.approval), "parked": approvals.parked_ms_of(record)}
            if record.approval else None,
            "cancel": json.loads(record.cancel) if record.cancel else None,
        }
        done = completed_steps(record)
        if done:  # a running multi-step task or agent loop: what is checkpointed so far
            body["progress"] = {"steps_done": len(done)}
            route = route_journal.read(done)
            if route.decision is not None:  # a routed agent's task: its route, and its current handler's part
                done = route_journal.handler_part(done, route, keep_summary=False)[0]
            if any(isinstance(e, dict) and e.get("kind") == "turn" for e in done):
                body["progress"]["transcript"] = transcript(done)
            if route.decision is not None:
                shown = body["progress"].setdefault("transcript", {"turns": [], "tool_calls": []})
                shown["route"] = route_journal.route_transcript(completed_steps(record))
        return self.json(api.answer(api.TaskView, **body))
