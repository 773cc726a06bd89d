"""The worker's web views: health, readiness, metrics, a task's and a job's record, breakers, approvals, dead letters.

Reads are answered by whichever worker is asked (table reads are forwarded to the
key's owner, lists are gathered from every worker). Mutations need the bearer
token, arrive as JSON of at most ``MAX_BODY`` bytes, are refused from another
origin, and become events on a topic; the worker owning the key applies them.
Schemas: docs/web.md.
"""

from __future__ import annotations

import asyncio
import hmac
import html
import json
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from aiokafka.errors import KafkaError
from faust.web import Request, Response, View

from agents_stream.contract import topics
from agents_stream.contract.models import ApprovalDecision
from agents_stream.kafka import security as kafka_security
from agents_stream.ops import dlq, metrics
from agents_stream.ops.notify import LinkError, verify
from agents_stream.ops.routing import ROUTED_HEADER, gather, routed
from agents_stream.orchestrator import JobRequest
from agents_stream.settings import Settings
from agents_stream.tables.definitions import Tables
from agents_stream.tables.leases import TaskRecord

if TYPE_CHECKING:
    from agents_stream.execution.executor import Executor
    from agents_stream.ledger.ledger import Ledger
    from agents_stream.resilience.circuits import Circuits

log = logging.getLogger(__name__)


MAX_BODY = 64 * 1024


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

    def consumer_lag(self) -> dict[str, int]: ...


class Refused(Exception):
    def __init__(self, status: int, error: str) -> None:
        super().__init__(error)
        self.status = status


def authorized(settings: Any, request: Request) -> bool:
    """Mutating endpoints: the bearer token, or the explicit (logged) open setting."""
    if settings.api_open:
        return True
    if not settings.api_token:
        return False
    given = request.headers.get("Authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {settings.api_token}".encode())


# The helpers below take the request as aiohttp has it (faust.web.Request declares none of these attributes).
def same_origin(request: Any) -> bool:
    """A browser names the page's origin on cross-site requests; a mutation from another site is refused."""
    origin = request.headers.get("Origin")
    if not origin or origin == "null":
        return origin is None
    return origin.split("://", 1)[-1].rstrip("/") == request.host


async def mutation_body(settings: Any, request: Any) -> dict[str, Any]:
    """The checks every mutating endpoint makes, in order; raises Refused with the status and what to do."""
    if not same_origin(request):
        raise Refused(
            403,
            "cross-origin request refused: use the console served by this worker, the CLI, or a client without an "
            "Origin header",
        )
    if not authorized(settings, request):
        raise Refused(401, "a bearer token is required (Authorization: Bearer <AGENTS_STREAM_API_TOKEN>)")
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise Refused(413, f"request body over {MAX_BODY} bytes")
    raw = await request.content.read(MAX_BODY + 1)
    if len(raw) > MAX_BODY:
        raise Refused(413, f"request body over {MAX_BODY} bytes")
    if not raw.strip():
        return {}
    if request.content_type != "application/json":
        raise Refused(415, "send the body as JSON with Content-Type: application/json")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise Refused(400, f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise Refused(400, "the body must be a JSON object")
    return body


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


async def publish_decision(app: Any, decision: ApprovalDecision) -> None:
    """A decision becomes an event on agent.approvals; the ledger owning the task applies it."""
    await send_event(app, topics.APPROVALS, decision.task_id, decision.model_dump_json().encode())


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>{t}</title>"
        "<meta name='viewport' content='width=device-width'></head>"
        "<body style='font-family:sans-serif;max-width:40em;margin:2em auto'><h1>{t}</h1>{b}</body></html>"
    ).format(t=html.escape(title), b=body)


def register(app: Any, runtime: Worker) -> None:
    """Add the views to ``app``'s web server; they read ``runtime`` (its tables, ledger, executor, circuits)."""
    settings = runtime.settings
    if runtime.ledger.policies and not settings.api_token and not settings.api_open:
        log.warning(
            "Approvals are configured but AGENTS_STREAM_API_TOKEN is not set: POST /approvals/<task_id> refuses every "
            "request (signed links, the CLI and agent.approvals events still work). Set a token to decide over HTTP."
        )
    if settings.api_open:
        log.warning(
            "AGENTS_STREAM_API_OPEN is set: mutating web endpoints accept requests without a token. Local demos only."
        )
    # In this order: a fixed path (/dlq/requeue) before the pattern that would match it too (/dlq/{ref}).
    _approval_views(app, runtime)
    _dead_letter_views(app, settings)
    _cancel_and_link_views(app, settings)
    _health_views(app, runtime)
    _record_views(app, runtime)

    from agents_stream.ops.console import register_console

    register_console(app)


def _approval_views(app: Any, runtime: Worker) -> None:
    settings = runtime.settings

    @app.page("/approvals")
    class Approvals(View):
        async def get(self, request: Request) -> Response:
            """The tasks awaiting approval on every worker (each worker knows those of its partitions)."""
            awaiting = list(runtime.ledger.awaiting())
            missing: list[str] = []
            if not request.headers.get(ROUTED_HEADER):
                bodies, missing = await gather(app, "/approvals")
                for body in bodies:
                    awaiting.extend(body.get("awaiting", []))
            awaiting.sort(key=lambda a: a.get("requested_at") or 0.0)
            return self.json({"worker": runtime.worker_id, "awaiting": awaiting, "unreachable": missing})

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
            except Exception as exc:  # bad fields: the caller's mistake, said plainly
                expected = '{"decision": "approve"|"reject", "by": "<who>"}'
                return self.json({"error": f"expected JSON {expected}: {exc}"}, status=400)
            try:
                await publish_decision(app, decision)
            except Refused as exc:
                return self.json({"error": str(exc)}, status=exc.status)
            accepted = {"accepted": True, "task_id": task_id, "decision": decision.decision, "by": decision.by}
            return self.json(accepted, status=202)


def _dead_letter_views(app: Any, settings: Settings) -> None:
    security = kafka_security.client_kwargs(settings)

    @app.page("/dlq")
    class DeadLetters(View):
        async def get(self, request: Request) -> Response:
            """Dead letters, newest first, filtered like ``agents-stream dlq list`` (agent, layer, reason, since)."""
            q = request.query
            try:
                limit = max(1, min(int(q.get("limit", "100")), 1000))
                filters = {k: q.get(k) or None for k in ("agent", "layer", "reason", "since", "until")}
                names = await dlq.dlq_topics(settings.broker, filters["agent"], timeout=10.0, security=security)
                records = await dlq.read_dead_letters(settings.broker, names, timeout=20.0, security=security)
                chosen = [d for d in records if dlq.matches(d, **filters)]
            except ValueError as exc:
                return self.json({"error": f"bad filter: {exc}"}, status=400)
            except Exception as exc:  # the broker did not answer in time: say so, the console retries
                error = f"reading the dead-letter topics failed: {type(exc).__name__}: {exc}"
                return self.json({"error": error}, status=503)
            chosen.sort(key=lambda d: d.headers.get("failed_at", ""), reverse=True)
            return self.json({"dead_letters": [dlq.summary(d) for d in chosen[:limit]], "count": len(chosen)})

    @app.page("/dlq/requeue")
    class Requeue(View):
        async def post(self, request: Request) -> Response:
            """Send one dead letter back to its task topic (body: ``{"ref"}`` or topic, partition, offset)."""
            try:
                body = await mutation_body(settings, request)
                ref = body.get("ref") or f"{body.get('topic')}:{body.get('partition')}:{body.get('offset')}"
                topic, _, _ = dlq.parse_ref(str(ref))
            except Refused as exc:
                return self.json({"error": str(exc)}, status=exc.status)
            except ValueError as exc:
                return self.json({"error": str(exc)}, status=400)
            try:
                found = await _dead_letter(settings, topic, str(ref), security)
                if not found:
                    return self.json({"error": f"no dead letter {ref}"}, status=404)
                (record, requeue_id), = await dlq.requeue(settings.broker, found, timeout=20.0, security=security)
            except (asyncio.TimeoutError, TimeoutError, KafkaError) as exc:
                error = (
                    f"the broker did not answer ({type(exc).__name__}); the requeue may or may not have been sent: "
                    "look the task up before retrying"
                )
                return self.json({"error": error}, status=503)
            log.info("Dead letter %s (task %s) requeued over HTTP as %s", ref, record.task_id, requeue_id)
            return self.json({"requeued": {**dlq.summary(record), "requeue_id": requeue_id}}, status=202)

    @app.page("/dlq/{ref}")
    class DeadLetterView(View):
        async def get(self, request: Request, ref: str) -> Response:
            try:
                topic, _, _ = dlq.parse_ref(ref)
            except ValueError as exc:
                return self.json({"error": str(exc)}, status=400)
            found = await _dead_letter(settings, topic, ref, security)
            if not found:
                return self.json({"error": f"no dead letter {ref}"}, status=404)
            return self.json(found[0].as_dict())


async def _dead_letter(settings: Settings, topic: str, ref: str, security: dict[str, Any]) -> list[Any]:
    """The dead letter ``ref`` on ``topic`` (a list of one), or an empty list."""
    letters = await dlq.read_dead_letters(settings.broker, [topic], timeout=20.0, security=security)
    return [d for d in letters if d.ref == ref]


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

    @app.page("/approvals/{task_id}/{decision}")
    class SignedLink(View):
        """The approve/reject links of a notification: GET shows a confirmation, its button POSTs."""

        def _check(self, request: Request, task_id: str, decision: str, fields: Any) -> tuple[int, str]:
            return verify(settings.approval_secret, task_id, decision, dict(fields), time.time())

        async def get(self, request: Request, task_id: str, decision: str) -> Response:
            try:
                level, by = self._check(request, task_id, decision, request.query)
            except LinkError as exc:
                return self.html(_page("Link not valid", f"<p>{html.escape(str(exc))}</p>"), status=403)
            hidden = "".join(
                f"<input type='hidden' name='{k}' value='{html.escape(request.query[k], quote=True)}'>"
                for k in ("level", "by", "exp", "sig")
            )
            verb = "Approve" if decision == "approve" else "Reject"
            return self.html(_page(f"{verb} task {task_id}?", (
                f"<p>Level {level + 1} ({html.escape(by)}). This records your decision once.</p>"
                f"<form method='post'>{hidden}<button type='submit' id='confirm'>{verb}</button></form>"
            )))

        async def post(self, request: Request, task_id: str, decision: str) -> Response:
            form = await request.post()
            try:
                level, by = self._check(request, task_id, decision, form)
            except LinkError as exc:
                return self.html(_page("Link not valid", f"<p>{html.escape(str(exc))}</p>"), status=403)
            made = ApprovalDecision(task_id=task_id, decision=decision, by=by, via="link")  # type: ignore[arg-type]
            try:
                await publish_decision(app, made)
            except Refused as exc:
                return self.html(_page("Not recorded", f"<p>{html.escape(str(exc))}</p>"), status=exc.status)
            recorded = f"<p>{html.escape(decision)} by {html.escape(by)} for task {html.escape(task_id)}.</p>"
            return self.html(_page("Decision recorded", recorded), status=202)


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
        }
        return self.json(body)
