"""The spans of the ledger's transitions (ops/tracing.py): a task's intake, each dispatch, its result (a dead letter
with its reason), approvals as events, the sub-agent calls it publishes.

Made only while tracing is on and for a task that has a trace (its record's ``trace``, the intake span's
traceparent: every later span of the task hangs under it, on whichever worker, after any restart). A transition's
spans end once its sends are confirmed; nothing here waits for anything, and the exporter is the SDK's batch
processor (a bounded queue, its own thread), so the ledger never blocks on a span.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from faust.types import TP

from agents_stream.contract.errors import PoisonMessage
from agents_stream.contract.models import TaskPayload
from agents_stream.ops import tracing
from agents_stream.ops.tracing import Span
from agents_stream.tables import leases
from agents_stream.tables.delegation import SendTask
from agents_stream.tables.leases import TaskRecord

__all__ = ["Traced", "intake", "poisoned", "traced"]

#: the fields of a TaskResult a result span carries as attributes
_RESULT_FIELDS = ("status", "source", "confidence", "attempts", "partial", "error")


def _messaging(tp: TP, offset: int) -> dict[str, Any]:
    return {
        "messaging.system": "kafka", "messaging.operation.type": "process", "messaging.destination.name": tp.topic,
        "messaging.destination.partition.id": str(tp.partition), "messaging.kafka.offset": offset,
    }


def intake(task: TaskPayload, tp: TP, offset: int, headers: Any, record: TaskRecord | None) -> Span | None:
    """The span of the ledger receiving a task message: under the task's trace when it has one already (a
    redelivery, a requeue), else under the message's traceparent header, else the root of a new trace."""
    parent = record.trace if record is not None and record.trace else tracing.header_traceparent(headers)
    return tracing.span(f"intake {task.agent_name}", parent, kind="consumer", attributes={
        **_messaging(tp, offset), "agents_stream.task_id": task.task_id, "agents_stream.agent": task.agent_name,
        "agents_stream.job_id": task.job_id,
    })


def poisoned(agent: str, tp: TP, offset: int, headers: Any, poison: PoisonMessage) -> None:
    """A message that is no task: a span (under its traceparent header, if it has one) saying it is dead-lettered
    and why."""
    span = tracing.span(f"intake {agent}", tracing.header_traceparent(headers), kind="consumer", attributes={
        **_messaging(tp, offset), "agents_stream.agent": agent,
    })
    if span is not None:
        span.event("dead_letter", {"reason": poison.reason, "layer": poison.layer, "detail": poison.detail})
        span.fail(f"dead-lettered: {poison.reason}")
        span.end()


class Traced:
    """The spans of one transition of one traced task: ``span`` takes its events; a dispatch and each sub-agent
    call get a span of their own. ``end`` ends them all (once the transition is durable)."""

    def __init__(self, span: Span, task_id: str, record: TaskRecord, worker: str, dispatching: bool) -> None:
        self.span = span
        self.task_id = task_id
        self.record = record
        self.worker = worker
        self._dispatching = dispatching  # ``span`` is the dispatch's own span
        self._spans = [span]

    def effect(self, effect: Any) -> None:
        """What an effect of the transition adds to its span: events, the result's attributes, its error."""
        span = self.span
        if isinstance(effect, leases.Control):
            span.event(effect.event, effect.details)
        elif isinstance(effect, leases.Notify):
            span.event("approval.notify", {"level": effect.level})
        elif isinstance(effect, leases.DeadLetter):
            span.event("dead_letter", {"reason": effect.reason, "layer": effect.layer, "attempts": effect.attempts})
            span.fail(f"dead-lettered: {effect.reason}")
        elif isinstance(effect, leases.EmitResult):
            try:
                result = json.loads(effect.result)
            except ValueError:
                return
            span.set({f"agents_stream.result.{k}": result.get(k) for k in _RESULT_FIELDS})
            usage = result.get("usage") or {}
            span.set({"gen_ai.usage.input_tokens": usage.get("input_tokens"),
                      "gen_ai.usage.output_tokens": usage.get("output_tokens"),
                      "agents_stream.cost_usd": usage.get("cost")})
            if result.get("status") == "failed":
                span.fail(str(result.get("error") or "failed"))

    def dispatch(self, number: int) -> str:
        """The traceparent a dispatch's run hangs its spans under (its model and tool calls)."""
        attributes = {"agents_stream.dispatch": number, "agents_stream.worker": self.worker}
        if self._dispatching:
            self.span.set(attributes)
            return self.span.traceparent
        child = tracing.span(f"dispatch {self.record.agent}", self.span.traceparent, attributes={
            "agents_stream.task_id": self.task_id, **attributes})
        if child is None:  # tracing went off meanwhile
            return self.span.traceparent
        self._spans.append(child)
        return child.traceparent

    def invoke_agent(self, send: SendTask) -> str | None:
        """A sub-agent call (agents as tools): the span of its sub-task's publication, the parent of the sub-task's
        own trace (its traceparent goes in the sub-task's Kafka headers)."""
        call = tracing.span(f"invoke_agent {send.agent}", self.span.traceparent, kind="producer", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": send.agent,
            "gen_ai.tool.call.id": send.task_id.rsplit("/", 1)[-1], "agents_stream.subtask_id": send.task_id,
            "messaging.system": "kafka", "messaging.destination.name": f"agent.tasks.{send.agent}",
        })
        if call is None:
            return None
        self._spans.append(call)
        return call.traceparent

    def end(self, new: TaskRecord | None = None) -> None:
        if new is not None:
            self.span.set({"agents_stream.state": new.state})
        for span in self._spans:
            span.end()


def traced(
    task_id: str, old: TaskRecord | None, new: TaskRecord | None, effects: Sequence[Any], given: Span | None,
    parent: str | None, worker: str,
) -> Traced | None:
    """The spans of a transition: ``given`` (the intake's) takes its events; else a span is started under
    ``parent`` for a transition worth one — the result (any end), a dispatch, or a transition with a control event
    (parked for approval, escalated, delegated) — named for it. None for a transition that only writes (a
    heartbeat's renewal, a journal entry) or when the task has no trace."""
    record = new or old
    if record is None:
        return None
    if given is not None:
        return Traced(given, task_id, record, worker, dispatching=False)
    if parent is None:
        return None
    dispatching = False
    ended = leases.ended(old, new)
    if ended is not None:
        name = f"result {record.agent}"
    elif any(isinstance(e, leases.Dispatch) for e in effects):
        name, dispatching = f"dispatch {record.agent}", True
    else:
        control = next((e for e in effects if isinstance(e, leases.Control)), None)
        if control is None:
            return None
        name = f"{control.event} {record.agent}"
    attributes = {"agents_stream.task_id": task_id, "agents_stream.agent": record.agent}
    span = tracing.span(name, parent, attributes=attributes)
    return None if span is None else Traced(span, task_id, record, worker, dispatching)
