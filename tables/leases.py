"""The task ledger's state machine: idempotency, leases and re-dispatch, pure and clock-free.

A task_id's record moves RUNNING → SUCCEEDED | FAILED | DEAD_LETTERED and
never back; a task a human must approve first waits in AWAITING_APPROVAL, then
runs or ends REJECTED (tables/approvals.py); an operator's (or a cancelled caller's) cancel ends an open task
CANCELLED (tables/cancel.py). Each transition function takes the stored record (or None) and an
event and returns the new record plus the effects the ledger must carry out;
no I/O happens here, so every path is unit-tested without a broker.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from agents_stream.tables.json_record import JsonRecord

RECORD_VERSION = 1

RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
DEAD_LETTERED = "dead_lettered"
AWAITING_APPROVAL = "awaiting_approval"
#: an agent loop waits for the sub-tasks it delegated to other agents (tables/delegation.py)
AWAITING_SUBTASKS = "awaiting_subtasks"
REJECTED = "rejected"
#: cancelled by an operator, its job or its caller (tables/cancel.py), possibly before it arrived
CANCELLED = "cancelled"
TERMINAL = frozenset({SUCCEEDED, FAILED, DEAD_LETTERED, REJECTED, CANCELLED})


@dataclass(frozen=True)
class TaskRecord(JsonRecord):
    """What the task table stores per task_id (as versioned JSON, never pickled)."""

    state: str
    agent: str
    dispatch: int  # how many times the task was handed to a worker's executor
    owner: str  # the worker instance that holds the lease
    lease_until: float  # epoch seconds
    payload: str  # the original message text: re-dispatch and dead letters need it
    topic: str
    partition: int
    offset: int
    received_at: float
    result: str | None = None  # the stored TaskResult JSON, re-emitted byte for byte
    finished_at: float | None = None
    #: the operator requeue (from the dead-letter topic) this run belongs to, and how many there were
    requeue_id: str | None = None
    requeues: int = 0
    #: JSON list of the dead-letter headers of earlier failures, oldest first (kept as history)
    history: str | None = None
    #: step checkpoint of a multi-step task: JSON list of the outputs of the steps done so far
    steps_done: str | None = None
    #: human approval (tables/approvals.py): JSON of reason, level, due, escalations and the decision
    approval: str | None = None
    #: contract.models.task_digest of the task: another task under the same task_id is a conflict (see ``conflict``)
    digest: str | None = None
    #: the sub-tasks an agent loop waits for (tables/delegation.py): JSON of the turn and {call id: agent}
    waiting: str | None = None
    #: who cancelled the task, how and why (tables/cancel.py): JSON of by, via, reason and at
    cancel: str | None = None
    #: W3C traceparent of the span of the task's intake (ops/tracing.py), the parent of its later spans (each
    #: dispatch, its result) on any worker, after any restart; None when it came in while tracing was off
    trace: str | None = None
    v: int = RECORD_VERSION

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def to_json(self) -> dict[str, Any]:
        # Every field is a str, number or None: a shallow dict, without asdict's deep copy (twice per task).
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


# Effects: what the ledger must do after a transition.
@dataclass(frozen=True)
class Dispatch:
    """Run the task on this worker's executor (dispatch number ``dispatch``)."""

    dispatch: int


@dataclass(frozen=True)
class EmitResult:
    """Send this exact TaskResult JSON to ``agent.results``."""

    result: str


@dataclass(frozen=True)
class DeadLetter:
    """Send the original payload to the agent's DLQ with these headers."""

    reason: str
    layer: str
    attempts: int


@dataclass(frozen=True)
class Control:
    """Publish a control event."""

    event: str
    details: dict[str, Any]


@dataclass(frozen=True)
class Track:
    """Keep this message's offset uncommitted until the task reaches a terminal state."""


@dataclass(frozen=True)
class ReleaseOffsets:
    """Release every offset tracked for the task (``Track``) once the effects are durable: it is terminal, or it
    waits in its record (parked, awaiting sub-tasks) holding no offset."""


@dataclass(frozen=True)
class Notify:
    """Tell approval level ``level`` (its webhook) that a task waits for its decision."""

    level: int


Effect = Dispatch | EmitResult | DeadLetter | Control | Track | ReleaseOffsets | Notify


@dataclass(frozen=True)
class TaskMessage:
    """A task message as the ledger read it: what a record that starts from it keeps of it.

    ``requeue_id`` and ``history``: set by ``agents-stream dlq requeue`` (its headers); ``digest``: the payload's
    (contract.models.task_digest); ``trace``: the intake span's traceparent."""

    agent: str
    payload: str
    topic: str
    partition: int
    offset: int
    requeue_id: str | None = None
    history: str | None = None
    digest: str | None = None
    trace: str | None = None


def receive(
    record: TaskRecord | None,
    message: TaskMessage,
    *,
    now: float,
    me: str,
    ttl: float,
    max_attempts: int,
    running_here: bool,
    approval: tuple[str, list[float]] | None = None,
) -> tuple[TaskRecord | None, list[Effect]]:
    """A task message arrived (first delivery, duplicate, redelivery after a crash, or an operator's requeue).

    A requeue (``message.requeue_id`` set, from ``agents-stream dlq requeue``) of a task
    that failed or was dead-lettered starts it again with its attempt counter
    reset; the same requeue delivered twice is an ordinary duplicate.

    ``approval`` (reason, each level's timeout) parks a new task for a human
    instead of dispatching it. Its offset is not tracked: the parked record is
    the task's recorded state, so the offset commits once that is durable.

    The message's ``trace`` is kept by a task that starts here (new, or requeued).
    """
    requeue_id = message.requeue_id
    if record is None or (
        requeue_id is not None and record.state in (FAILED, DEAD_LETTERED) and record.requeue_id != requeue_id
    ):
        return _first_delivery(record, message, now=now, me=me, ttl=ttl, approval=approval)
    if record.terminal:
        # A finished task never reaches a provider again; a redelivery re-emits its result.
        if record.result is not None:
            return record, [EmitResult(record.result)]
        return record, []
    if record.state in (AWAITING_APPROVAL, AWAITING_SUBTASKS):
        # It waits for a human or for sub-tasks, and the decision or the results arrive as events.
        return record, []
    if running_here:
        # Our executor has it; hold this offset too: a revoke and re-assign dropped the first delivery's hold
        # (docs/decisions.md, "Holds and take-overs in the lease machine"). ReleaseOffsets releases every hold of the
        # task.
        return record, [Track()]
    # Another owner's lease (or ours before a restart): hold and wait for its outcome. Never take over here, even
    # if the lease looks lapsed: only the scanner's `expired` event does (``expire``; docs/decisions.md, "Leases and
    # takeover").
    return record, [Track()]


def _first_delivery(
    record: TaskRecord | None, message: TaskMessage, *, now: float, me: str, ttl: float,
    approval: tuple[str, list[float]] | None,
) -> tuple[TaskRecord, list[Effect]]:
    """A new task, or a requeue of a failed or dead-lettered one: lease it here and dispatch (or park) it."""
    requeue_id = message.requeue_id
    new = TaskRecord(
        state=RUNNING,
        agent=message.agent,
        dispatch=1,
        owner=me,
        lease_until=now + ttl,
        payload=message.payload,
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        received_at=now,
        requeue_id=requeue_id,
        requeues=(record.requeues if record else 0) + (1 if requeue_id else 0),
        history=message.history,
        digest=message.digest,
        trace=message.trace,
    )
    effects: list[Effect] = [Track(), Dispatch(1)]
    if approval is not None:
        reason, timeouts = approval
        new, effects = park(new, reason=reason, now=now, timeouts=timeouts)
    if requeue_id is not None:
        effects.append(Control("task.requeued", {"requeue_id": requeue_id, "requeues": new.requeues}))
    return new, effects


def conflict(record: TaskRecord | None, *, agent: str, digest: str, recorded_digest: str | None) -> str | None:
    """Why a message of ``record``'s task_id is another task (another agent, or another payload than the one
    recorded: ``recorded_digest``, the record's digest or one computed from its payload); None when it is the same
    task (a redelivery, a requeue, a producer's retry), which ``receive`` answers from the record."""
    if record is None:
        return None
    if record.agent != agent:
        return f"task_id already recorded for agent {record.agent!r}, now sent for {agent!r}"
    if recorded_digest is not None and recorded_digest != digest:
        return f"task_id already recorded for another payload of agent {agent!r} (digest {recorded_digest[:12]})"
    return None


def heartbeat(
    record: TaskRecord | None, *, dispatch: int, owner: str, now: float, ttl: float
) -> tuple[TaskRecord | None, list[Effect]]:
    """The executor running dispatch ``dispatch`` is alive: extend its lease."""
    if record is None or record.state != RUNNING or record.dispatch != dispatch:
        return record, []
    return replace(record, owner=owner, lease_until=max(record.lease_until, now + ttl)), []


def finish(
    record: TaskRecord | None,
    *,
    status: str,
    result: str,
    reason: str | None,
    now: float,
    dispatch: int | None = None,
) -> tuple[TaskRecord | None, list[Effect]]:
    """An executor reports a terminal outcome. The first one wins; later ones are dropped.

    ``dispatch``: the run that reports it. Only the run that holds the lease ends the task: an outcome of an
    earlier dispatch (a worker whose partition moved, or that was cut off, and whose task was taken over) is stale
    and dropped, so a task's result always comes from the run whose journal the record holds (docs/security.md,
    "Fencing"). None: a transition of the ledger's own (a cancel, a timeout), not of a run."""
    if record is None or record.state != RUNNING or (dispatch is not None and dispatch != record.dispatch):
        return record, []
    effects: list[Effect] = [EmitResult(result)]
    if status == FAILED:
        effects.append(DeadLetter(reason or "permanent_error", "downstream", record.dispatch))
        effects.append(Control("task.failed", {"reason": reason}))
    effects.append(ReleaseOffsets())
    # The checkpoint has served: the result holds every step's output.
    return replace(record, state=status, result=result, finished_at=now, steps_done=None), effects


def ended_by(record: TaskRecord | None, *, dispatch: int, status: str) -> str | None:
    """The stored result of a task that the outcome ``status`` of run ``dispatch`` itself ended, else None.

    That outcome read again means its first reader lost the partition before the result went out (a result waits
    for its record to be durable, docs/decisions.md "A result waits for its record"): the result is sent again,
    byte for byte, as for a redelivered task."""
    if record is None or not record.terminal or dispatch != record.dispatch or record.state != status:
        return None
    return record.result


def checkpoint(
    record: TaskRecord | None, *, index: int, output: Any, dispatch: int | None = None,
) -> tuple[TaskRecord | None, list[Effect]]:
    """Step ``index`` of a multi-step task finished with ``output``: keep it, so a re-run starts after it.

    Steps finish in order; a report for a step already recorded (a duplicate, or
    a re-run racing the first) or out of order changes nothing. A report of a dispatch that no longer holds the
    lease (``dispatch`` older than the record's: its run was taken over) changes nothing either: the journal is
    the current run's alone, and the stale run never acts on an entry the ledger did not keep.
    """
    if record is None or record.state != RUNNING or (dispatch is not None and dispatch != record.dispatch):
        return record, []
    done = json.loads(record.steps_done) if record.steps_done else []
    if index != len(done):
        return record, []
    return replace(record, steps_done=json.dumps([*done, output], separators=(",", ":"))), []


def completed_steps(record: TaskRecord | None) -> list[Any]:
    """The outputs of the steps a task has already done (empty for a fresh or single-step task)."""
    return json.loads(record.steps_done) if record is not None and record.steps_done else []


def appended_steps(old: TaskRecord | None, new: TaskRecord) -> list[Any] | None:
    """The steps ``new`` did after ``old``'s, parsed from the text ``new``'s journal appended to ``old``'s; None
    when it did not append to it (then compare ``completed_steps`` of both). ``checkpoint`` writes the whole list
    again in one compact form, so a journal that grew keeps ``old``'s text up to its closing bracket: the new
    steps are read without parsing a long journal (a 100 KB tool result) twice at every transition."""
    before = old.steps_done if old is not None and old.steps_done else ""
    after = new.steps_done or ""
    if after == before:
        return []
    if not before or before == "[]":
        return completed_steps(new)
    head = before[:-1]  # its steps, without the closing bracket: a comma after it separates the list's own entries
    if before.endswith("]") and after.startswith(head) and after[len(head):len(head) + 1] == ",":
        added: list[Any] = json.loads("[" + after[len(head) + 1:])
        return added
    return None


def expire(
    record: TaskRecord | None,
    *,
    dispatch: int,
    now: float,
    me: str,
    ttl: float,
    max_attempts: int,
    running_here: bool,
    owner_gone: bool = False,
) -> tuple[TaskRecord | None, list[Effect]]:
    """The scanner saw the lease of ``dispatch`` lapse: re-dispatch, or give up after max_attempts.

    ``owner_gone``: the lease's owner is no longer a member of the group (it died, or was cut off and expelled),
    or its run said it stopped (``RunReleased``). Its lease need not be waited out: a worker outside the group can
    no longer act for the partition (docs/security.md, "Fencing"), so the task is taken over at once."""
    if record is None or record.state != RUNNING or record.dispatch != dispatch:
        return record, []
    if running_here:
        # Our own executor holds it (queued or held): renew instead of duplicating the call.
        return replace(record, owner=me, lease_until=now + ttl), []
    if now < record.lease_until and not owner_gone:
        return record, []
    if record.dispatch >= max_attempts:
        return replace(record, state=DEAD_LETTERED, finished_at=now), [
            DeadLetter(
                f"max_attempts_exceeded: the lease lapsed {record.dispatch} times",
                "recovery",
                record.dispatch,
            ),
            Control("task.dead_lettered", {"layer": "recovery", "attempts": record.dispatch}),
            ReleaseOffsets(),
        ]
    why = "lease_lapsed" if now >= record.lease_until else "owner_left"
    return _take_over(record, now=now, me=me, ttl=ttl, why=why)


def _take_over(
    record: TaskRecord, *, now: float, me: str, ttl: float, why: str
) -> tuple[TaskRecord, list[Effect]]:
    """``why``: ``lease_lapsed``, or ``owner_left`` (the owner left the group or released the task first)."""
    nxt = record.dispatch + 1
    return replace(record, dispatch=nxt, owner=me, lease_until=now + ttl), [
        Dispatch(nxt),
        Control("task.redispatched", {"dispatch": nxt, "previous_owner": record.owner, "why": why}),
    ]


def park(record: TaskRecord, *, reason: str, now: float, timeouts: list[float]) -> tuple[TaskRecord, list[Effect]]:
    """Park a new task for approval level 0 instead of dispatching it (no lease: nothing runs).
    ``timeouts`` (one per level) are kept with it."""
    approval = {
        "reason": reason, "level": 0, "requested_at": now, "due": now + timeouts[0], "timeouts": list(timeouts),
        "escalations": [], "decision": None,
    }
    parked = replace(
        record, state=AWAITING_APPROVAL, dispatch=0, owner="", lease_until=0.0,
        approval=json.dumps(approval, separators=(",", ":"), sort_keys=True),
    )
    return parked, [Notify(0), Control("approval.requested", {"reason": reason, "level": 0, "due": approval["due"]})]


def ended(old: TaskRecord | None, new: TaskRecord | None) -> str | None:
    """The terminal state the transition ``old`` → ``new`` ended the task in; None when it did not end it
    (still open, or it had ended before: a redelivery re-emitting the stored result ends nothing)."""
    if new is None or not new.terminal or (old is not None and old.terminal):
        return None
    return new.state


def dump(record: TaskRecord) -> str:
    """Compact JSON for logs and web views."""
    return json.dumps(record.to_json(), separators=(",", ":"))
