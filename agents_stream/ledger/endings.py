"""Where a task's end goes: its result to ``agent.results``, to its job and to the agent loop that delegated it;
a task that failed for good to its agent's dead-letter topic (and, without a result, as a failure to both)."""

from __future__ import annotations

from typing import Callable

from faust.types import TP

from agents_stream.contract import topics
from agents_stream.contract.events import FannedInResult
from agents_stream.kafka.outbox import Outbox, Send
from agents_stream.ledger import identity
from agents_stream.ledger.intake import HISTORY_HEADER
from agents_stream.ledger.records import job_of
from agents_stream.ledger.sub_tasks import Delegation
from agents_stream.ops import metrics, tracing
from agents_stream.orchestrator import fan_in_event
from agents_stream.tables import leases
from agents_stream.tables.leases import TaskRecord

__all__ = ["dead_letter_sends", "result_sends"]


def result_sends(outbox: Outbox, delegation: Delegation, task_id: str, record: TaskRecord, result: str) -> list[Send]:
    """A finished task's result: on ``agent.results``, to its caller (a sub-task) and to its job (fan-in)."""
    sends = [outbox.record(topics.RESULTS, task_id.encode(), result.encode("utf-8"))]
    sends += delegation.result_sends(record, result)
    job_id = job_of(record)
    if job_id is not None:  # fan-in: the job's owner hears of every result of its tasks
        fanned = FannedInResult.model_validate_json(result)  # the whole result rides along
        event = fan_in_event(fanned, record.agent, identity.recorded_digest(record))
        sends.append(outbox.record(topics.JOB_EVENTS, job_id.encode(), event))
    return sends


def dead_letter_sends(
    outbox: Outbox, delegation: Delegation, task_id: str, record: TaskRecord, effect: leases.DeadLetter,
) -> tuple[list[Send], Callable[[], object]]:
    """A task that failed for good: its payload to the agent's dead-letter topic (and a failure to its job and
    its caller when it has no result); the sends, and what counts it once they are durable."""
    extra = [("agents_stream.requeues", str(record.requeues).encode())] if record.requeues else []
    if record.history:
        extra.append((HISTORY_HEADER, record.history.encode("utf-8")))
    if record.trace:  # the task's trace: a requeue of this dead letter is traced in it
        extra.append((tracing.TRACEPARENT, record.trace.encode("ascii")))
    sends = [outbox.dead_letter(
        TP(record.topic, record.partition), record.offset, task_id.encode(), record.payload.encode("utf-8"),
        agent=record.agent, reason=effect.reason, layer=effect.layer, attempts=effect.attempts, headers=extra,
    )]
    agent, layer = record.agent, effect.layer
    counted = lambda: metrics.dead_letters.labels(agent, layer).inc()  # noqa: E731
    if record.result is not None:
        return sends, counted
    # No result will come: its job counts it failed, and so does the agent loop that delegated it.
    failed = FannedInResult(task_id=task_id, status="failed", error=f"dead-lettered: {effect.reason}")
    job_id = job_of(record)
    if job_id is not None:
        event = fan_in_event(failed, record.agent, identity.recorded_digest(record))
        sends.append(outbox.record(topics.JOB_EVENTS, job_id.encode(), event))
    sends += delegation.result_sends(record, failed.model_dump_json(exclude_none=True))
    return sends, counted
