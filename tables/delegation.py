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
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from agents_stream.tables.leases import AWAITING_SUBTASKS, RUNNING, Control, Dispatch, Effect, Settle, TaskRecord

__all__ = ["SendTask", "arrive", "delegate", "waiting_for"]


@dataclass(frozen=True)
class SendTask:
    """Publish a sub-task (its TaskPayload JSON) to its agent's task topic, keyed by its task_id."""

    agent: str
    task_id: str
    payload: str


def waiting_for(record: TaskRecord | None) -> dict[str, str]:
    """{call id: callee agent} the task still waits for (empty when it waits for none)."""
    if record is None or not record.waiting:
        return {}
    calls = json.loads(record.waiting).get("calls", {})
    return calls if isinstance(calls, dict) else {}


def delegate(
    record: TaskRecord | None, *, dispatch: int, turn: int, subtasks: list[tuple[str, str, str, str]],
) -> tuple[TaskRecord | None, list[Effect | SendTask]]:
    """The loop of dispatch ``dispatch`` delegated ``subtasks`` (call id, agent, sub-task id, payload JSON each)."""
    if record is not None and record.state == AWAITING_SUBTASKS and record.dispatch == dispatch:
        # The same report again (applied before, redelivered): send the sub-tasks still awaited again, in case
        # the first sends were lost with a crash; the callees take a task id once.
        pending = waiting_for(record)
        return record, [SendTask(agent, sub_id, payload) for call_id, agent, sub_id, payload in subtasks
                        if call_id in pending]
    if record is None or record.state != RUNNING or record.dispatch != dispatch or not subtasks:
        return record, []  # a stale run's report, or a task that moved on
    waiting = {"turn": turn, "calls": {call_id: agent for call_id, agent, _, _ in subtasks}}
    parked = replace(record, state=AWAITING_SUBTASKS, owner="", lease_until=0.0,
                     waiting=json.dumps(waiting, separators=(",", ":"), sort_keys=True))
    sends: list[Effect | SendTask] = [SendTask(agent, sub_id, payload) for _, agent, sub_id, payload in subtasks]
    details = {"turn": turn, "subtasks": [sub_id for _, _, sub_id, _ in subtasks]}
    return parked, [Settle(), *sends, Control("agent.delegated", details)]


def arrive(
    record: TaskRecord | None, *, call_id: str, agent: str, result: dict[str, Any], now: float, me: str, ttl: float,
) -> tuple[TaskRecord | None, list[Effect | SendTask]]:
    """A sub-task's result: journaled at its call; the last one dispatches the loop again (to this worker)."""
    pending = waiting_for(record)
    if record is None or record.state != AWAITING_SUBTASKS or pending.get(call_id) != agent:
        return record, []
    state = json.loads(record.waiting or "{}")
    entry = {"kind": "subresult", "turn": state["turn"], "id": call_id, "agent": agent, "result": result}
    done = json.loads(record.steps_done) if record.steps_done else []
    left = {k: v for k, v in pending.items() if k != call_id}
    # an empty "calls" stays: the timers table keeps finding the task after a rebalance (its offsets are settled)
    waiting = json.dumps({**state, "calls": left}, separators=(",", ":"), sort_keys=True)
    new = replace(record, waiting=waiting, steps_done=json.dumps([*done, entry], separators=(",", ":")))
    if left:
        return new, []
    resumed = replace(new, state=RUNNING, dispatch=record.dispatch + 1, owner=me, lease_until=now + ttl)
    return resumed, [Dispatch(record.dispatch + 1), Control("agent.resumed", {"turn": state["turn"]})]
