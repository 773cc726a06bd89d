"""The task table's records as the ledger reads them: a task's record, its job, its timer key, whether it is parked, and
the result JSON a finished task is answered with."""

from __future__ import annotations

import json
from typing import Any

from agents_stream.contract.events import TaskFailed, TaskSucceeded
from agents_stream.contract.models import Confidence, Status, TaskResult, iso_utc, utcnow_iso
from agents_stream.tables.leases import TaskRecord


def record_of(table: Any, task_id: str) -> TaskRecord | None:
    """The task's record in the task table, or None."""
    data = table.get(task_id)
    return TaskRecord.from_json(data) if data else None


def job_of(record: TaskRecord | None) -> str | None:
    """The job a task belongs to (its payload's ``job_id``), or None."""
    if record is None:
        return None
    job_id = json.loads(record.payload).get("job_id")
    return job_id if isinstance(job_id, str) and job_id else None


def timer_key(task_id: str) -> str:
    """A parked task's key in the timers table."""
    return f"task/{task_id}"


def parked(record: TaskRecord | None) -> bool:
    """Waiting for a decision or for sub-tasks, or running after: found by the scanner, not by a redelivery."""
    return record is not None and (record.approval is not None or record.waiting is not None) and not record.terminal


def result_json(
    task_id: str, record: TaskRecord, event: TaskSucceeded | TaskFailed, outcome_at: float | None,
) -> str:
    """The TaskResult JSON a finished task is answered with (and stored), from its record and final outcome.

    ``completed_at`` is ``outcome_at``, the outcome record's Kafka timestamp, when it has one (> 0): every ledger
    that applies that outcome (a new owner after a rebalance, an old one that has not yet noticed it lost the
    partition) then answers with the same bytes, a duplicate and never a second distinct result."""
    status: Status
    confidence: Confidence
    if isinstance(event, TaskFailed):  # a failure carries no answer: its result says "failed" throughout
        status, output, confidence, partial_ = "failed", None, "failed", False
    else:
        status, output, confidence, partial_ = event.status, event.output, event.confidence, event.partial
    return _result(task_id, record, outcome_at, status=status, output=output, confidence=confidence,
                   source=event.source, partial=partial_, usage=event.usage.model_copy(), error=event.error,
                   transcript=event.transcript)


def cancelled_result_json(task_id: str, record: TaskRecord, error: str, at: float) -> str:
    """A cancelled task's result: a failure saying who cancelled it and why, the same bytes on every ledger that
    applies the same cancel (``at`` is the cancel record's timestamp)."""
    return _result(task_id, record, at, status="failed", output=None, confidence="failed", source="cancel",
                   error=error[:2000])


def _result(task_id: str, record: TaskRecord, at: float | None, **fields: Any) -> str:
    """The result's JSON: its job from the record's payload (none when the payload no longer parses: the result is
    still sent), its attempts the record's dispatches, completed at ``at`` when it is a record's timestamp."""
    try:
        payload = json.loads(record.payload)
    except ValueError:
        payload = None
    job_id = payload.get("job_id") if isinstance(payload, dict) else None
    return TaskResult(
        task_id=task_id, agent_name=record.agent, attempts=record.dispatch,
        job_id=job_id if isinstance(job_id, str) else None,
        completed_at=iso_utc(at) if at is not None and at > 0 else utcnow_iso(), **fields,
    ).to_json()
