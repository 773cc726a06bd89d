"""The worker's web views: health, readiness, metrics, a task's and a job's record, breakers, approvals, dead letters,
the console's samples and recent list (agents_stream.ops.web_live).

Reads are answered by whichever worker is asked (table reads are forwarded to the
key's owner, lists are gathered from every worker, a page at a time); reads of task
data need the read or the write token and every view but the probes checks the Host
header (agents_stream.ops.access). Mutations need the write token, arrive as JSON of
at most ``MAX_BODY`` bytes (agents_stream.ops.bodies), are refused from another
origin, and become events on a topic; the worker owning the key applies them.
Schemas: docs/web.md.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from aiokafka.errors import KafkaError
from faust.web import Request, Response, View

from agents_stream.contract import topics
from agents_stream.contract.models import ApprovalDecision
from agents_stream.execution.agent_loop import transcript
from agents_stream.ops import access, metrics
from agents_stream.ops.access import Refused, same_origin
from agents_stream.ops.bodies import MAX_BODY, mutation_body
from agents_stream.ops.notify import LinkClaim, LinkError, verify, with_signature
from agents_stream.ops.pages import APPROVALS_LIMIT, limit_of, merge_approvals, page_approvals, parse_after
from agents_stream.ops.routing import ROUTED_HEADER, forwarded_headers, gather, routed
from agents_stream.ops.samples import SampleRing
from agents_stream.ops.web_dlq import register_dead_letter_views
from agents_stream.ops.web_live import register_live_views
from agents_stream.orchestrator import JobRequest
from agents_stream.settings import Settings
from agents_stream.tables import approvals
from agents_stream.tables.definitions import Tables
from agents_stream.tables.leases import AWAITING_APPROVAL, TaskRecord, completed_steps

if TYPE_CHECKING:
    from agents_stream.execution.executor import Executor
    from agents_stream.ledger.ledger import Ledger
    from agents_stream.resilience.circuits import Circuits

log = logging.getLogger(__name__)


# Re-exported for the views below and their callers: the body rules live in agents_stream.ops.bodies.
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


async def send_event(app: Any, topic: str, key: str, value: bytes) -> None:
    """Publish one event and wait for the broker's ack: both the producer's buffer and the ack are bounded."""
    channel = app.topic(topic, key_serializer="raw", value_serializer="raw")

    async def send() -> None:
        fut = await channel.send(key=key.encode(), value=value)
        await fut

    try:
        await asyncio.wait_for(send(), timeout=15.0)
    except (asyncio.TimeoutError, KafkaError) as exc:
        raise Refused(
            503,
            f"the broker did not confirm the event on {topic} ({type(exc).__name__}); it may not have been sent: "
            "retry (a decision or cancel sent twice counts once)",
        ) from None


async def publish_decision(app: Any, decision: ApprovalDecision, secret: str) -> None:
    """A decision becomes an event on agent.approvals, signed with the approval secret when there is one (the
    ledger records an unsigned one as ``signed: false``); the ledger owning the task applies it."""
    decision = with_signature(secret, decision)
    await send_event(app, topics.APPROVALS, decision.task_id, decision.model_dump_json(exclude_none=True).encode())


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>{t}</title>"
        "<meta name='viewport' content='width=device-width'></head>"
        "<body style='font-family:sans-serif;max-width:40em;margin:2em auto'><h1>{t}</h1>{b}</body></html>"
    ).format(t=html.escape(title), b=body)


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
    _approval_views(app, runtime)
    register_dead_letter_views(app, settings)
    _cancel_and_link_views(app, settings)
    _health_views(app, runtime)
    _record_views(app, runtime)
    register_live_views(app, runtime)

    from agents_stream.ops.console import register_console

    register_console(app)


def _approval_views(app: Any, runtime: Worker) -> None:
    settings = runtime.settings

    @app.page("/approvals")
    class Approvals(View):
        async def get(self, request: Request) -> Response:
            """A page of the tasks awaiting approval on every worker (each knows those of its partitions), oldest
            first; each worker sends at most ``limit`` of its own, after the cursor."""
            try:
                limit, after = limit_of(request.query, *APPROVALS_LIMIT), parse_after(request.query.get("after"))
            except ValueError as exc:
                return self.json({"error": f"bad parameter: {exc}"}, status=400)
            shares = [page_approvals(runtime.ledger.awaiting(), after, limit)]
            if request.headers.get(ROUTED_HEADER):
                return self.json({"worker": runtime.worker_id, **shares[0]})
            bodies, missing = await gather(app, request.rel_url.raw_path_qs, forwarded_headers(request))
            page = merge_approvals(shares + bodies, limit)
            return self.json({"worker": runtime.worker_id, **page, "unreachable": missing})

    @app.page("/approvals/{task_id}")
    class Decide(View):
        async def post(self, request: Request, task_id: str) -> Response:
            try:
                body = await mutation_body(settings, request)
            except Refused as exc:
                return self.json({"error": str(exc)}, status=exc.status)
            try:
                decision = ApprovalDecision.model_validate({
                    "task_id": task_id, "decision": body.get("decision"), "by": body.get("by"), "via": "http",
                    "comment": body.get("comment"),
                })
            except Exception as exc:  # bad fields (control characters too): the caller's mistake, said plainly
                expected = ('{"decision": "approve"|"reject"|"cancel", "by": "<who>", "comment": "<why>"}, no control '
                            'characters')
                return self.json({"error": f"expected JSON {expected}: {exc}"}, status=400)
            try:
                await publish_decision(app, decision, settings.approval_secret)
            except Refused as exc:
                return self.json({"error": str(exc)}, status=exc.status)
            accepted = {"accepted": True, "task_id": task_id, "decision": decision.decision, "by": decision.by}
            return self.json(accepted, status=202)

    _signed_link_views(app, runtime)


def _cancel_and_link_views(app: Any, settings: Settings) -> None:
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
            return self.json({"accepted": True, "job_id": job_id, "by": cancel.by}, status=202)


    @app.page("/tasks/{task_id}/cancel")
    class CancelTask(View):
        async def post(self, request: Request, task_id: str) -> Response:
            """Cancel a task (running, parked, waiting for sub-tasks); ``agent`` also stops one not read yet."""
            try:
                body = await mutation_body(settings, request)
                decision = ApprovalDecision.model_validate({
                    "task_id": task_id, "decision": "cancel", "by": body.get("by") or "http", "via": "http",
                    "comment": body.get("reason") or None, "agent": body.get("agent") or None,
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
            return self.json({"accepted": True, "task_id": task_id, "by": decision.by}, status=202)


def _signed_link_views(app: Any, runtime: Worker) -> None:
    settings = runtime.settings
    table = runtime.tables.tasks

    @app.page("/approvals/{task_id}/{decision}")
    class SignedLink(View):
        """The approve/reject links of a notification: GET shows a confirmation, its button POSTs."""

        def _check(self, request: Request, task_id: str, decision: str, fields: Any) -> LinkClaim:
            return verify(settings.approval_secret, task_id, decision, dict(fields), time.time())

        @routed(app, table, "task_id", settings.partitions)  # the owner has the record: it can say "stale"
        async def get(self, request: Request, task_id: str, decision: str) -> Response:
            try:
                claim = self._check(request, task_id, decision, request.query)
            except LinkError as exc:
                return self.html(_page("Link not valid", f"<p>{html.escape(str(exc))}</p>"), status=403)
            stale = _stale_link(table, task_id, claim)
            if stale is not None:
                return self.html(_page("Link not valid", f"<p>{html.escape(stale)}</p>"), status=409)
            level, by = claim.level, claim.by
            hidden = "".join(
                f"<input type='hidden' name='{k}' value='{html.escape(request.query[k], quote=True)}'>"
                for k in ("level", "by", "exp", "parked", "sig")
            )
            verb = "Approve" if decision == "approve" else "Reject"
            return self.html(_page(f"{verb} task {task_id}?", (
                f"<p>Level {level + 1} ({html.escape(by)}). This records your decision once.</p>"
                f"<form method='post'>{hidden}<button type='submit' id='confirm'>{verb}</button></form>"
            )))

        async def post(self, request: Request, task_id: str, decision: str) -> Response:
            form = await request.post()
            try:
                claim = self._check(request, task_id, decision, form)
            except LinkError as exc:
                return self.html(_page("Link not valid", f"<p>{html.escape(str(exc))}</p>"), status=403)
            # bound to the link's level and parking: the ledger ignores it (approval.ignored, with the reason) if
            # the task has moved on to another level or was parked again since the link was sent
            made = ApprovalDecision.model_validate({  # verify() refused any other decision
                "task_id": task_id, "decision": decision, "by": claim.by, "via": "link", "level": claim.level,
                "parked": claim.parked,
            })
            try:
                await publish_decision(app, made, settings.approval_secret)
            except Refused as exc:
                return self.html(_page("Not recorded", f"<p>{html.escape(str(exc))}</p>"), status=exc.status)
            recorded = (
                f"<p>{html.escape(decision)} by {html.escape(claim.by)} for task {html.escape(task_id)} at level "
                f"{claim.level + 1} was sent; the task's worker applies it if the task still awaits that level.</p>"
            )
            return self.html(_page("Decision recorded", recorded), status=202)


def _stale_link(table: Any, task_id: str, claim: LinkClaim) -> str | None:
    """Why a genuine link no longer decides its task (decided, another level, another parking), or None. The
    ledger makes the same check when the decision arrives; this one only spares a confirmation that would not count."""
    data = table.get(task_id)
    if not data:
        return None
    record = TaskRecord.from_json(data)
    if record.state != AWAITING_APPROVAL:
        return f"the task is {record.state}: it was decided before, or timed out"
    return approvals.binding_problem(record, level=claim.level, parked=claim.parked)


def _health_views(app: Any, runtime: Worker) -> None:
    @app.page("/healthz")
    class Healthz(View):
        async def get(self, request: Request) -> Response:
            return self.json({"status": "ok", "worker": runtime.worker_id})

    @app.page("/readyz")
    class Readyz(View):
        async def get(self, request: Request) -> Response:
            # The port opens only after table recovery; 503 once shutdown began.
            if app.should_stop:
                return self.json({"status": "stopping"}, status=503)
            if not runtime.ready:
                return self.json({"status": "starting"}, status=503)
            ex = runtime.executor
            return self.json({
                "status": "ready",
                "worker": runtime.worker_id,
                "in_flight": ex.running,
                "queued": len(ex.runs) - ex.running,
                "held": ex.held,
                "providers_down": runtime.circuits.providers_down(),
            })

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
            return self.json({"worker": runtime.worker_id, "providers": runtime.circuits.describe()})


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
            return self.json(body)

    @app.page("/tasks/{task_id}")
    @routed(app, table, "task_id", settings.partitions)
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
            "approval": json.loads(record.approval) if record.approval else None,
            "cancel": json.loads(record.cancel) if record.cancel else None,
        }
        done = completed_steps(record)
        if done:  # a running multi-step task or agent loop: what is checkpointed so far
            body["progress"] = {"steps_done": len(done)}
            if any(isinstance(e, dict) and e.get("kind") == "turn" for e in done):
                body["progress"]["transcript"] = transcript(done)
        return self.json(body)
