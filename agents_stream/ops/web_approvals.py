"""The approval views: ``GET /approvals`` (the inbox), ``POST /approvals/<task_id>`` (a decision) and the signed
links of notifications, and how a decision becomes an event on agent.approvals.

A decision names what its human saw (tables/approvals.binding_problem): the app id (this worker's), the task's
agent and its parking (``parked`` of /approvals or of the task's view). ``POST /approvals/<task_id>`` needs
``parked`` in its body: filling it in from the record at the time of the request would let a request retried
after a 503 (whose event did land) decide the task's next parking. The worker owning the task checks the decision
against the record and answers 409 with the reason when it does not decide it; the ledger checks again when the
event arrives (the record may change in between). Schemas: docs/web.md.
"""

from __future__ import annotations

import asyncio
import html
import time
from typing import TYPE_CHECKING, Any

from aiokafka.errors import KafkaError
from faust.web import Request, Response, View

from agents_stream.contract import topics
from agents_stream.contract.models import ApprovalDecision
from agents_stream.ops import api_models as api
from agents_stream.ops.access import Refused
from agents_stream.ops.bodies import mutation_body
from agents_stream.ops.notify import LINK_FIELDS, LinkClaim, LinkError, verify, with_signature
from agents_stream.ops.pages import APPROVALS_LIMIT, limit_of, merge_approvals, page_approvals, parse_after
from agents_stream.ops.routing import ROUTED_HEADER, ask_owner, forwarded_headers, gather, owner_elsewhere, routed
from agents_stream.tables import approvals
from agents_stream.tables.leases import AWAITING_APPROVAL, TaskRecord

if TYPE_CHECKING:
    from agents_stream.ops.web import Worker

__all__ = ["publish_decision", "register_approval_views", "send_event"]

EXPECTED = (
    '{"decision": "approve"|"reject", "by": "<who>", "parked": <the parked of GET /approvals>, "agent": "<the '
    'task\'s agent, optional>", "comment": "<why>"} or {"decision": "cancel", "by": "<who>"}, no control characters'
)


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
            "retry (a decision or cancel sent twice counts once; a decision names its parking, so a retry never "
            "decides a later one)",
        ) from None


async def publish_decision(app: Any, decision: ApprovalDecision, secret: str) -> None:
    """A decision becomes an event on agent.approvals, signed with the approval secret when there is one (the
    ledger records an unsigned one as ``signed: false``); the ledger owning the task applies it."""
    decision = with_signature(secret, decision)
    await send_event(app, topics.APPROVALS, decision.task_id, decision.model_dump_json(exclude_none=True).encode())


def decision_refusal(data: Any, decision: ApprovalDecision, app_id: str) -> tuple[int, str] | None:
    """(HTTP status, why) when an approve or reject does not decide the task whose record is ``data``, or None."""
    if not data:
        return 404, f"unknown task_id {decision.task_id!r} in app id {app_id}"
    record = TaskRecord.from_json(data)
    if record.state != AWAITING_APPROVAL:
        return 409, f"the task is {record.state}: it was decided before, or timed out"
    problem = approvals.binding_problem(
        record, here=app_id, app_id=decision.app_id, agent=decision.agent, parked=decision.parked,
        level=decision.level,
    )
    return None if problem is None else (409, problem)


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>{t}</title>"
        "<meta name='viewport' content='width=device-width'></head>"
        "<body style='font-family:sans-serif;max-width:40em;margin:2em auto'><h1>{t}</h1>{b}</body></html>"
    ).format(t=html.escape(title), b=body)


def register_approval_views(app: Any, runtime: Worker) -> None:
    settings = runtime.settings
    table = runtime.tables.tasks

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
            return self.json(api.answer(api.ApprovalsPage, worker=runtime.worker_id, **page, unreachable=missing))

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
                    "comment": body.get("comment"), "parked": body.get("parked"), "agent": body.get("agent"),
                    "app_id": body.get("app_id") or settings.app_id,
                })
            except Exception as exc:  # bad fields (control characters too): the caller's mistake, said plainly
                return self.json({"error": f"expected JSON {EXPECTED}: {exc}"}, status=400)
            if decision.decision != "cancel":
                if decision.parked is None:
                    return self.json({"error": (
                        "parked is required: the parking this decision is for, as GET /approvals and GET "
                        "/tasks/<task_id> show it (a decision names what its human saw, so a retry cannot decide "
                        f"the task's next parking); expected JSON {EXPECTED}")}, status=400)
                checked = await self._at_owner(request, task_id, body, decision)
                if not isinstance(checked, ApprovalDecision):
                    return checked  # the owner's answer, or why the decision does not decide the task
                decision = checked
            try:
                await publish_decision(app, decision, settings.approval_secret)
            except Refused as exc:
                return self.json({"error": str(exc)}, status=exc.status)
            accepted = api.answer(api.DecisionAccepted, accepted=True, task_id=task_id, decision=decision.decision,
                                  by=decision.by)
            return self.json(accepted, status=202)

        async def _at_owner(
            self, request: Request, task_id: str, body: dict[str, Any], decision: ApprovalDecision,
        ) -> Response | ApprovalDecision:
            """The owner's answer when another worker owns the task (the request forwarded there), a refusal when
            the decision does not decide the task, or the decision (its agent filled in from the record when the
            body named none) that this worker, the owner, publishes."""
            try:
                owner = owner_elsewhere(app, table, task_id, settings.partitions, request)
                if owner is not None:  # the owner's own send waits up to 15 s
                    status, content_type, answer = await ask_owner(
                        app, owner, request, json=body, timeout_s=20, unanswered=(
                            "the decision may have been sent: retry (it names its parking, so it decides that one "
                            "only)"))
                    return self.bytes(answer, content_type=content_type, status=status)
            except Refused as exc:
                return self.json({"error": str(exc)}, status=exc.status)
            data = table.get(task_id)
            if decision.agent is None and data:  # optional in the body: the task's own, from the record
                decision = decision.model_copy(update={"agent": TaskRecord.from_json(data).agent})
            refused = decision_refusal(data, decision, settings.app_id)
            if refused is not None:
                return self.json({"error": refused[1], "task_id": task_id}, status=refused[0])
            return decision

    _signed_link_views(app, runtime)


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
            stale = _stale_link(table, task_id, claim, settings.app_id)
            if stale is not None:
                return self.html(_page("Link not valid", f"<p>{html.escape(stale)}</p>"), status=409)
            level, by = claim.level, claim.by
            hidden = "".join(
                f"<input type='hidden' name='{k}' value='{html.escape(request.query[k], quote=True)}'>"
                for k in LINK_FIELDS
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
            # bound to the link's level, parking, app id and agent: the ledger ignores it (approval.ignored, with
            # the reason) if the task has moved on to another level or was parked again since the link was sent
            made = ApprovalDecision.model_validate({  # verify() refused any other decision
                "task_id": task_id, "decision": decision, "by": claim.by, "via": "link", "level": claim.level,
                "parked": claim.parked, "app_id": claim.app_id, "agent": claim.agent,
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


def _stale_link(table: Any, task_id: str, claim: LinkClaim, app_id: str) -> str | None:
    """Why a genuine link no longer decides its task (decided, another level, another parking), or None. The
    ledger makes the same check when the decision arrives; this one only spares a confirmation that would not count."""
    data = table.get(task_id)
    if not data:
        return None
    record = TaskRecord.from_json(data)
    if record.state != AWAITING_APPROVAL:
        return f"the task is {record.state}: it was decided before, or timed out"
    return approvals.binding_problem(
        record, here=app_id, app_id=claim.app_id, agent=claim.agent, parked=claim.parked, level=claim.level,
    )
