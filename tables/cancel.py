"""Cancelling a task (pure): an operator's cancel, its job's, or its caller's when the caller was cancelled.

    RUNNING ─────────────► CANCELLED: the run on this worker is stopped, its offsets released
    AWAITING_APPROVAL ───► CANCELLED: no decision is waited for any more (a later one changes nothing)
    AWAITING_SUBTASKS ───► CANCELLED: each sub-task still awaited is cancelled too (a cancel per sub-task)
    (no record yet) ─────► CANCELLED before it arrived, when the cancel names the agent and is signed:
                           the task, when it comes, is answered with the cancelled result and never runs
    terminal ────────────► unchanged: a finished task stays finished

A cancelled task's result is a failure whose error says who cancelled it and why; it is stored and re-emitted
byte for byte like any other. Outcomes of the stopped run that arrive later change nothing (the record is
terminal).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from agents_stream.tables.delegation import waiting_for
from agents_stream.tables.leases import (
    AWAITING_APPROVAL,
    AWAITING_SUBTASKS,
    CANCELLED,
    RUNNING,
    Control,
    Effect,
    EmitResult,
    ReleaseOffsets,
    TaskRecord,
)

__all__ = ["CancelTask", "StopRun", "arrived", "before_arrival", "cancel", "cancelled_before_arrival", "reason_of"]

#: the open states a cancel ends
CANCELLABLE = frozenset({RUNNING, AWAITING_APPROVAL, AWAITING_SUBTASKS})


@dataclass(frozen=True)
class StopRun:
    """Stop the task's run on this worker's executor, wherever it is (queued, held, calling): its outcome, if one
    still comes, is ignored."""


@dataclass(frozen=True)
class CancelTask:
    """Send a cancel for this sub-task (the cancelled task's call of ``agent``) to ``agent.approvals``."""

    task_id: str
    agent: str


def _dump(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


def reason_of(by: str, reason: str) -> str:
    """The error of a cancelled task's result."""
    return f"cancelled by {by}: {reason}"


def cancel(
    record: TaskRecord | None, *, task_id: str, by: str, via: str, reason: str, now: float, result: str,
) -> tuple[TaskRecord | None, list[Effect | StopRun | CancelTask]]:
    """A cancel for ``record``'s task: the open task ends CANCELLED with ``result``; anything else is unchanged."""
    if record is None or record.state not in CANCELLABLE:
        return record, []
    made = {"by": by, "via": via, "reason": reason, "at": now, "state": record.state}
    ended = replace(record, state=CANCELLED, result=result, finished_at=now, owner="", lease_until=0.0,
                    cancel=_dump(made))
    details: dict[str, Any] = {"by": by, "via": via, "reason": reason, "was": record.state}
    subtasks = [CancelTask(f"{task_id}/{call_id}", agent) for call_id, agent in sorted(waiting_for(record).items())]
    if record.state == AWAITING_SUBTASKS:
        details["subtasks"] = [sub.task_id for sub in subtasks]
    effects: list[Effect | StopRun | CancelTask] = [Control("task.cancelled", details), EmitResult(result)]
    if record.state == RUNNING:
        effects += [StopRun(), ReleaseOffsets()]
    elif record.state == AWAITING_SUBTASKS:
        effects += subtasks
    return ended, effects


def before_arrival(
    *, agent: str, topic: str, partition: int, by: str, via: str, reason: str, now: float,
) -> tuple[TaskRecord, list[Effect]]:
    """A signed cancel of a task of ``agent`` that has not arrived yet (a sub-task or a job's step still in its
    topic): recorded, so the task never runs when it comes. The record has no payload until then."""
    made = {"by": by, "via": via, "reason": reason, "at": now, "state": None}
    record = TaskRecord(
        state=CANCELLED, agent=agent, dispatch=0, owner="", lease_until=0.0, payload="", topic=topic,
        partition=partition, offset=-1, received_at=now, finished_at=now, cancel=_dump(made),
    )
    return record, [Control("task.cancelled", {"by": by, "via": via, "reason": reason, "was": "not_arrived"})]


def cancelled_before_arrival(record: TaskRecord | None) -> dict[str, Any] | None:
    """The cancel (by, via, reason, at) of a task cancelled before it arrived and not yet answered; else None."""
    if record is None or record.state != CANCELLED or record.result is not None or not record.cancel:
        return None
    made = json.loads(record.cancel)
    return made if isinstance(made, dict) else None


def cancelled_by(record: TaskRecord | None, *, by: str, via: str, reason: str) -> str | None:
    """The stored result of a task this very cancel (the same person, channel and reason) ended, else None: read
    again, its first reader lost the partition before the result went out (a result waits for its record)."""
    if record is None or record.state != CANCELLED or record.result is None or not record.cancel:
        return None
    made = json.loads(record.cancel)
    if not isinstance(made, dict) or (made.get("by"), made.get("via"), made.get("reason")) != (by, via, reason):
        return None
    return record.result


def arrived(
    record: TaskRecord, *, payload: str, digest: str | None, topic: str, partition: int, offset: int, now: float,
    result: str,
) -> tuple[TaskRecord, list[Effect]]:
    """The task cancelled before it arrived came: its record takes its payload, and it is answered, not run."""
    answered = replace(record, payload=payload, digest=digest, topic=topic, partition=partition, offset=offset,
                       received_at=now, result=result)
    return answered, [EmitResult(result)]
