"""Agents as tools: an agent loop's calls to other agents, as sub-tasks its task waits for (pure).

    RUNNING ──(the loop delegates calls c1, c2)──► AWAITING_SUBTASKS: sub-tasks <task_id>/<c1>, <task_id>/<c2>
       ▲          published to the callees' topics; no lease, the task's offsets released, nothing runs
       │
       └──(the last sub-task's result arrived)── each result journaled in the task's checkpoint as it comes

The sub-tasks are ordinary tasks: any worker of any app id running the callee
takes them, with the usual leases, retries and dead letters. The ledger that
finishes one sends its result to the parent's outcomes topic (``parent`` in its
payload); a result for a call the task does not wait for (a duplicate, a late
re-send, a forgery naming another agent) changes nothing.

A result counts for a call only when it comes from that call's sub-task: its
task id is ``<task_id>/<call_id>`` and, when both sides know it, the digest of
the task it ran is the digest of the payload the caller published. A producer
can publish a task naming a victim's call under the right id (call ids are
predictable), but not with the payload the victim's loop wrote: its result
changes nothing (docs/security.md, "A task's parent").

A result that would make the caller's record larger than one Kafka record is
journaled as a failed call instead (``result_too_large``): the loop reads that
its callee's answer was too large and goes on (docs/decisions.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Callable

from agents_stream.tables.leases import (
    AWAITING_SUBTASKS,
    RUNNING,
    Control,
    Dispatch,
    Effect,
    ReleaseOffsets,
    TaskRecord,
)

__all__ = ["CallResult", "SendTask", "arrive", "delegate", "sub_task_id", "waiting_for"]


@dataclass(frozen=True)
class SendTask:
    """Publish a sub-task (its TaskPayload JSON) to its agent's task topic, keyed by its task_id."""

    agent: str
    task_id: str
    payload: str


def sub_task_id(task_id: str, call_id: str) -> str:
    """The task id of call ``call_id``'s sub-task (contract.models.sub_task_id: the one a parent allows)."""
    return f"{task_id}/{call_id}"


def waiting_for(record: TaskRecord | None) -> dict[str, str]:
    """{call id: callee agent} the task still waits for (empty when it waits for none)."""
    if record is None or not record.waiting:
        return {}
    calls = json.loads(record.waiting).get("calls", {})
    return calls if isinstance(calls, dict) else {}


def delegate(
    record: TaskRecord | None, *, dispatch: int, turn: int, subtasks: list[tuple[str, str, str, str]],
    digests: dict[str, str] | None = None,
) -> tuple[TaskRecord | None, list[Effect | SendTask]]:
    """The loop of dispatch ``dispatch`` delegated ``subtasks`` (call id, agent, sub-task id, payload JSON each);
    ``digests``: {call id: the digest of its sub-task's payload}, which its result must carry to count."""
    if record is not None and record.state == AWAITING_SUBTASKS and record.dispatch == dispatch:
        # The same report again (applied before, redelivered): send the sub-tasks still awaited again, in case
        # the first sends were lost with a crash; the callees take a task id once.
        pending = waiting_for(record)
        return record, [SendTask(agent, sub_id, payload) for call_id, agent, sub_id, payload in subtasks
                        if call_id in pending]
    if record is None or record.state != RUNNING or record.dispatch != dispatch or not subtasks:
        return record, []  # a stale run's report, or a task that moved on
    waiting: dict[str, Any] = {"turn": turn, "calls": {call_id: agent for call_id, agent, _, _ in subtasks}}
    if digests:
        waiting["digests"] = {call_id: digests[call_id] for call_id, _, _, _ in subtasks if call_id in digests}
    parked = replace(record, state=AWAITING_SUBTASKS, owner="", lease_until=0.0,
                     waiting=json.dumps(waiting, separators=(",", ":"), sort_keys=True))
    sends: list[Effect | SendTask] = [SendTask(agent, sub_id, payload) for _, agent, sub_id, payload in subtasks]
    details = {"turn": turn, "subtasks": [sub_id for _, _, sub_id, _ in subtasks]}
    return parked, [ReleaseOffsets(), *sends, Control("agent.delegated", details)]


def is_from_call(
    record: TaskRecord, task_id: str, *, sub_task: str, call_id: str, agent: str, digest: str | None,
) -> bool:
    """A result of sub-task ``sub_task`` (of ``agent``, run as the task of ``digest``) is the result of the call
    ``call_id`` of task ``task_id`` that ``record`` waits for: the call's agent, its derived id, and its payload's
    digest when the caller recorded one and the callee sent one (a callee of an older version sends none)."""
    if waiting_for(record).get(call_id) != agent or sub_task != sub_task_id(task_id, call_id):
        return False
    expected = json.loads(record.waiting or "{}").get("digests", {}).get(call_id)
    return expected is None or digest is None or digest == expected


@dataclass(frozen=True)
class CallResult:
    """A sub-task's result for the call that delegated it: the sub-task's id, the call's id, the agent that ran it,
    its result, and the digest of the payload that ran (None from a worker that predates it)."""

    sub_task: str
    call_id: str
    agent: str
    result: dict[str, Any]
    digest: str | None = None


def arrive(
    record: TaskRecord | None, arrived: CallResult, *, task_id: str, now: float, me: str, ttl: float,
    fits: Callable[[TaskRecord], str | None] | None = None,
) -> tuple[TaskRecord | None, list[Effect | SendTask]]:
    """A sub-task's result (``arrived``, for task ``task_id``): journaled at its call; the last one dispatches
    the loop again (to this worker). A result that is not the call's own (``is_from_call``) changes nothing.

    ``fits`` says why the record would be too large (or None when it fits): then a failed result saying so is
    journaled in the sub-task's place."""
    sub_task, call_id, agent, result = arrived.sub_task, arrived.call_id, arrived.agent, arrived.result
    pending = waiting_for(record)
    if record is None or record.state != AWAITING_SUBTASKS or not is_from_call(
        record, task_id, sub_task=sub_task, call_id=call_id, agent=agent, digest=arrived.digest,
    ):
        return record, []
    state = json.loads(record.waiting or "{}")
    state.get("digests", {}).pop(call_id, None)
    left = {k: v for k, v in pending.items() if k != call_id}
    # an empty "calls" stays: the timers table keeps finding the task after a rebalance (its offsets are released)
    waiting = json.dumps({**state, "calls": left}, separators=(",", ":"), sort_keys=True)
    done = json.loads(record.steps_done) if record.steps_done else []
    entry = {"kind": "subresult", "turn": state["turn"], "id": call_id, "agent": agent, "result": result}
    new = replace(record, waiting=waiting, steps_done=json.dumps([*done, entry], separators=(",", ":")))
    effects: list[Effect | SendTask] = []
    too_large = fits(new) if fits is not None else None
    if too_large is not None:  # the call fails in the journal; the loop reads why and goes on
        refused = {"task_id": sub_task, "agent_name": agent, "status": "failed", "error": too_large}
        entry = {**entry, "result": refused}
        new = replace(new, steps_done=json.dumps([*done, entry], separators=(",", ":")))
        effects.append(Control("agent.subresult_refused", {"call": call_id, "sub_task": sub_task,
                                                           "error": too_large}))
    if left:
        return new, effects
    resumed = replace(new, state=RUNNING, dispatch=record.dispatch + 1, owner=me, lease_until=now + ttl)
    return resumed, [*effects, Dispatch(record.dispatch + 1), Control("agent.resumed", {"turn": state["turn"]})]
