"""The master orchestrator: jobs on ``agent.jobs`` fanned out as tasks to the sub-agents and fanned back in."""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime
from typing import Any, Literal

from faust.types import TP
from pydantic import BaseModel, ConfigDict, Field, model_validator

from agents_stream.contract import topics
from agents_stream.contract.errors import PoisonMessage
from agents_stream.contract.events import (
    JOB_EVENTS,
    EventDecodeError,
    FannedInResult,
    JobDeadline,
    JobEvent,
    JobTaskResult,
    decode,
    encode,
)
from agents_stream.contract.models import (
    NO_CONTROL,
    SCHEMA_VERSION,
    ApprovalDecision,
    TaskPayload,
    parse_json_model,
    task_digest,
)
from agents_stream.kafka.outbox import Outbox, Send
from agents_stream.ledger.intake import moved
from agents_stream.ledger.poison import dead_letter_unreadable
from agents_stream.ops import tracing
from agents_stream.ops.notify import with_signature
from agents_stream.ops.recent import RecentJobs
from agents_stream.settings import Settings
from agents_stream.tables import jobs as machine
from agents_stream.tables.definitions import Tables
from agents_stream.tables.jobs import JobRecord

log = logging.getLogger(__name__)


class JobRequest(BaseModel):
    """Submit a job (a ``plan``, or a ``goal`` for a ``planner`` agent) or cancel one; keyed by job_id."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    schema_version: int = SCHEMA_VERSION
    # a task id is "<job_id>/<step id>" and at most 256 characters
    job_id: str = Field(min_length=1, max_length=180, pattern=r"^[^\x00-\x1f\x7f]+$")
    action: Literal["submit", "cancel"] = "submit"
    plan: Any = None
    goal: str | None = None
    planner: str | None = None
    context_data: dict[str, Any] = Field(default_factory=dict)
    #: seconds from when the orchestrator first sees the job, or an ISO-8601 time (the earlier wins)
    timeout_s: float | None = Field(default=None, gt=0)
    deadline: str | None = None
    #: for a cancel: who and why (recorded in the job's result)
    by: str = Field(default="unknown", max_length=200, pattern=NO_CONTROL)
    reason: str = Field(default="", max_length=2000, pattern=NO_CONTROL)

    @model_validator(mode="after")
    def _one_way(self) -> JobRequest:
        if self.action == "submit":
            if (self.plan is None) == (self.goal is None):
                raise ValueError("a job needs exactly one of plan or goal")
            if self.goal is not None and not self.planner:
                raise ValueError("a goal needs a planner (the agent that turns it into a plan)")
        if self.deadline is not None:
            self.deadline_epoch()  # raises on a bad time
        return self

    def deadline_epoch(self, now: float = 0.0) -> float | None:
        ends = []
        if self.deadline is not None:
            try:
                ends.append(datetime.fromisoformat(self.deadline.replace("Z", "+00:00")).timestamp())
            except ValueError:
                raise ValueError(f"deadline {self.deadline!r} is not an ISO-8601 time") from None
        if self.timeout_s is not None:
            ends.append(now + self.timeout_s)
        return min(ends) if ends else None


class Orchestrator:
    """Applies job requests and job events; the ``jobs`` table's one writer (inside the ledger's loop).

    A job's record and the tasks or result a transition publishes all go through the outbox, so they are
    confirmed by the broker before the event's offset may be committed. The transitions are pure (tables/jobs.py).
    """

    def __init__(self, outbox: Outbox, tables: Tables, agents: list[str], settings: Settings) -> None:
        self.outbox = outbox
        self.settings = settings
        self.table = tables.jobs
        self.timers = tables.timers
        self.agents = agents  # every configured agent: a job may use agents other workers run
        self.topics = frozenset({topics.JOBS, topics.JOB_EVENTS})
        self._asked: dict[str, float] = {}
        self.recent = RecentJobs(settings.console_recent)  # the console's recent list: the jobs changed last here

    def handle(self, tp: TP, offset: int, key: bytes | None, value: bytes | None, headers: Any = None) -> None:
        if tp.topic == topics.JOBS:
            self._on_request(tp, offset, key, value, headers)
        else:
            self._on_event(tp, offset, key, value)

    def _on_request(self, tp: TP, offset: int, key: bytes | None, value: bytes | None, headers: Any) -> None:
        try:
            request: JobRequest = parse_json_model(value, JobRequest, self.settings.payload_max_bytes)
        except PoisonMessage as poison:
            dead_letter_unreadable(
                self.outbox, tp, offset, key, value, poison, what="job request", topic=topics.dlq_of(topics.JOBS),
            )
            return
        if moved(self.outbox, self.settings.partitions, tp, offset, request.job_id, value, headers):
            return
        record = self._get(request.job_id)
        now = time.time()
        if request.action == "cancel":
            if record is None:
                log.info("Cancel of unknown job %s by %s ignored", request.job_id, request.by)
                return
            new, effects = machine.cancel(record, by=request.by, reason=request.reason or "no reason given", now=now)
        else:
            trace = _job_trace(request, tp, offset, headers) if record is None and tracing.on() else None
            new, effects = machine.submit(
                record, job_id=request.job_id, plan=request.plan, goal=request.goal, planner=request.planner,
                context_data=request.context_data, deadline=request.deadline_epoch(now), agents=self.agents, now=now,
                trace=trace,
            )
        self._apply(tp, offset, request.job_id, record, new, effects)

    def _on_event(self, tp: TP, offset: int, key: bytes | None, value: bytes | None) -> None:
        parsed = _job_event(tp, offset, key, value)
        if parsed is None:
            return
        job_id, event = parsed
        record = self._get(job_id)
        now = time.time()
        if record is not None and record.terminal and record.result is not None:
            # A redelivered event after the job ended: its result (identical bytes) may not have gone out
            # before a crash, so it goes out again; nothing else changes.
            self._apply(tp, offset, job_id, record, record, [machine.EmitJobResult(record.result)])
            return
        match event:
            case EventDecodeError():
                _skip(tp, offset, job_id, event)
                return
            case JobTaskResult(result=r, agent_name=agent, task_digest=digest):
                try:
                    result = machine.StepResult(
                        task_id=r.task_id, status=r.status, output=r.output, confidence=r.confidence, source=r.source,
                        error=r.error, agent=agent, digest=digest,
                    )
                    new, effects = machine.on_result(record, result, agents=self.agents, now=now)
                except (KeyError, ValueError, TypeError, AttributeError) as exc:  # the machine may refuse it
                    log.warning("Skipping job %s result event that is not a TaskResult: %r", job_id, exc)
                    return
            case JobDeadline():
                new, effects = machine.expire(record, now=now)
        self._apply(tp, offset, job_id, record, new, effects)

    def _apply(
        self, tp: TP, offset: int, job_id: str, old: JobRecord | None, new: JobRecord | None, effects: list[Any],
    ) -> None:
        outbox = self.outbox
        dispatched = [e for e in effects if isinstance(e, (machine.DispatchStep, machine.DispatchPlanner))]
        payloads = {e.task_id: self._payload(job_id, e) for e in dispatched}
        new = machine.stamp(new, {task_id: task_digest(p) for task_id, p in payloads.items()})
        sends = self._write(tp, job_id, old, new)
        shown = new or old
        if shown is not None:
            self.recent.job(job_id, shown, tp.partition, time.time())
        # The job result goes out only once the record saying the job ended is durable: otherwise a crash in
        # between could let the next owner finish the job differently and emit a second, different result.
        final: list[Send] = []
        trace = new.trace if new is not None and tracing.on() else None
        for effect in effects:
            if isinstance(effect, (machine.DispatchStep, machine.DispatchPlanner)):
                sends.append(self._task_send(job_id, payloads[effect.task_id], trace))
            elif isinstance(effect, machine.Control) and effect.event.startswith("alert."):
                log.warning("Job %s: a result was refused: %s", job_id, effect.details)
                outbox.control(effect.event, job_id, None, effect.details)
            elif isinstance(effect, machine.EmitJobResult):
                final.append(outbox.record(topics.JOB_RESULTS, job_id.encode(), effect.result.encode("utf-8")))
                if trace is not None and new is not None and new.terminal and (old is None or not old.terminal):
                    _job_result_span(job_id, trace, new)
            elif isinstance(effect, machine.Control):
                outbox.control(effect.event, job_id, None, effect.details)
                if effect.event == "job.cancelled":
                    # The steps in flight must not go on for a job that ended: each is cancelled, running,
                    # parked or still in its topic (ledger/cancel_decisions.py). Part of the confirmed sends, so a crash
                    # cannot skip it.
                    in_flight = effect.details.get("tasks", [])
                    sends.extend(self._cancel_send(job_id, task_id, effect.details) for task_id in in_flight)
        after = [lambda: outbox.deliver(tp, offset, final)] if final else []
        if sends or after:
            outbox.deliver(tp, offset, sends, after)

    def _write(self, tp: TP, job_id: str, old: JobRecord | None, new: JobRecord | None) -> list[Send]:
        """Write the job's new record (and its deadline timer, when it starts or stops being watched); their sends."""
        sends: list[Send] = []
        if new is not None and new != old:
            self.table[job_id] = new.to_json()
            sends.append(self.outbox.changelog(self.table, tp.partition, job_id))
            timer = job_timer_key(job_id)
            watched = new.deadline is not None and not new.terminal
            if watched and timer not in self.timers:
                self.timers[timer] = {"kind": "job"}
                sends.append(self.outbox.changelog(self.timers, tp.partition, timer))
            elif not watched and timer in self.timers:
                del self.timers[timer]
                sends.append(self.outbox.changelog(self.timers, tp.partition, timer))
        return sends

    def _cancel_send(self, job_id: str, task_id: str, details: dict[str, Any]) -> Send:
        decision = ApprovalDecision(
            task_id=task_id, decision="cancel", by=f"job:{details.get('by', 'unknown')}", via="job",
            comment=f"its job {job_id} ended ({details.get('reason', 'no reason given')})"[:2000],
            agent=details.get("agents", {}).get(task_id),
        )
        signed = with_signature(self.settings.approval_secret, decision)  # a job's own cancel is signed
        body = signed.model_dump_json(exclude_none=True).encode("utf-8")
        return self.outbox.record(topics.APPROVALS, task_id.encode("utf-8"), body)

    @staticmethod
    def _payload(job_id: str, effect: machine.DispatchStep | machine.DispatchPlanner) -> TaskPayload:
        return TaskPayload(
            task_id=effect.task_id,
            agent_name=effect.agent,
            instruction=effect.instruction,
            context_data=effect.context_data,
            job_id=job_id,
            output_schema=machine.PLAN_SCHEMA if isinstance(effect, machine.DispatchPlanner) else None,
        )

    def _task_send(self, job_id: str, payload: TaskPayload, trace: str | None = None) -> Send:
        """A step's task to its agent's topic (``trace``: the job's traceparent; the task's publish span is its
        child, and the task's own trace hangs under it)."""
        body = payload.model_dump_json(exclude_none=True).encode("utf-8")
        limit = self.settings.payload_max_bytes
        if len(body) > limit:
            # The ledger would dead-letter it as payload_too_large and no result would ever come back:
            # the step fails now instead, through the job's own events, with the reason.
            log.warning(
                "Job %s: step task %s is %d bytes with its upstream outputs (limit %d); the step fails. "
                "Raise AGENTS_STREAM_PAYLOAD_MAX_BYTES or make the upstream steps answer shorter",
                job_id, payload.task_id, len(body), limit,
            )
            failed = FannedInResult(
                task_id=payload.task_id, status="failed",
                error=f"payload_too_large: {len(body)} bytes with the upstream outputs > {limit}",
            )
            event = fan_in_event(failed, payload.agent_name, task_digest(payload))
            return self.outbox.record(topics.JOB_EVENTS, job_id.encode("utf-8"), event)
        topic = topics.task_topic(payload.agent_name)
        headers = None
        span = tracing.span(f"publish {topic}", trace, kind="producer", attributes={
            "messaging.system": "kafka", "messaging.operation.type": "send", "messaging.destination.name": topic,
            "agents_stream.task_id": payload.task_id, "agents_stream.job_id": job_id,
        }) if trace is not None else None
        if span is not None:
            headers = tracing.headers_with(None, span.traceparent)
            span.end()
        return self.outbox.record(topic, payload.task_id.encode("utf-8"), body, headers=headers)

    def _get(self, job_id: str) -> JobRecord | None:
        data = self.table.get(job_id)
        return JobRecord.from_json(data) if data else None

    def scan(self, now: float) -> list[str]:
        """Jobs on this worker's partitions whose deadline passed: ask (via an event) to end them."""
        due = []
        throttle = max(1.0, self.settings.lease_ttl_s / 4)
        asked, self._asked = self._asked, {}
        for key in list(self.timers.keys()):
            if not key.startswith("job/"):
                continue
            job_id = key[len("job/"):]
            if not machine.due(self._get(job_id), now):
                continue
            if now - asked.get(job_id, 0.0) >= throttle:
                asked[job_id] = now
                due.append(job_id)
            self._asked[job_id] = asked[job_id]
        return due

    def describe(self, job_id: str) -> dict[str, Any] | None:
        """The job's record for /jobs/{job_id}: state, steps with their status and task ids, result."""
        record = self._get(job_id)
        if record is None:
            return None
        body = record.to_json()
        body["result"] = json.loads(record.result) if record.result else None
        return body


def _job_event(
    tp: TP, offset: int, key: bytes | None, value: bytes | None,
) -> tuple[str, JobEvent | EventDecodeError] | None:
    """(job_id, event) of a job event; its decode error instead when it has a kind but is not one we apply
    (an ended job re-emits its result even then, as it always has); None (logged) when it is no event at all."""
    try:
        job_id = key.decode("utf-8")  # type: ignore[union-attr]
    except (AttributeError, UnicodeDecodeError) as exc:
        log.warning("Skipping job event without a usable key at %s[%d]@%d: %r", tp.topic, tp.partition, offset, exc)
        return None
    try:
        return job_id, decode(value, JOB_EVENTS)
    except EventDecodeError as exc:
        if exc.kind is None:
            log.warning("Skipping malformed job event at %s[%d]@%d: %s", tp.topic, tp.partition, offset, exc.reason)
            return None
        return job_id, exc


def _skip(tp: TP, offset: int, job_id: str, exc: EventDecodeError) -> None:
    if exc.unknown_kind:
        log.warning("Skipping job event of unknown kind %r for %s (a newer worker's?)", exc.kind, job_id)
    else:
        log.warning("Skipping malformed job event for %s at %s[%d]@%d: %s", job_id, tp.topic, tp.partition, offset,
                    exc.reason)


def _job_trace(request: JobRequest, tp: TP, offset: int, headers: Any) -> str | None:
    """The span of a job's submission (under its traceparent header, if it has one); its traceparent, which the
    job's record keeps: its steps' tasks are traced under it."""
    span = tracing.span("job submit", tracing.header_traceparent(headers), kind="consumer", attributes={
        "agents_stream.job_id": request.job_id, "agents_stream.job.planner": request.planner,
        "messaging.system": "kafka", "messaging.destination.name": tp.topic, "messaging.kafka.offset": offset,
    })
    if span is None:
        return None
    span.end()
    return span.traceparent


def _job_result_span(job_id: str, trace: str, record: JobRecord | None) -> None:
    """The span of a job's end: its state and, when it did not succeed, why."""
    span = tracing.span("job result", trace, attributes={
        "agents_stream.job_id": job_id, "agents_stream.job.state": record.state if record else None,
        "agents_stream.job.reason": record.reason if record else None,
    })
    if span is None:
        return
    if record is not None and record.reason:
        span.fail(record.reason)
    span.end()


def job_timer_key(job_id: str) -> str:
    return f"job/{job_id}"


def fan_in_event(result: FannedInResult, agent: str | None = None, digest: str | None = None) -> bytes:
    """The ledger's copy of a job task's result for the orchestrator (``agent.job.events``, keyed by job_id),
    so every result of a job reaches the partition (and worker) that owns the job's record; with the agent and
    the digest of the task that made it, so the job counts it only for the task it dispatched."""
    return encode(JobTaskResult(result=result, agent_name=agent, task_digest=digest))
