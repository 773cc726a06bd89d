"""Human approval of a task, pure and clock-free: the policy, and the parked task's decisions and escalations.

    (task arrives, policy matches) ──► AWAITING_APPROVAL at level 0
        │   (the agent's share of the partition already parked: DEAD_LETTERED, approval_backlog_full)
        ├── approve (HTTP, signed link, CLI or event) ──► RUNNING: dispatched, once
        ├── reject ──► REJECTED: a failed result, no provider call, no dead letter
        └── level's timeout ──► the next level (its own timeout and webhook)
                                 └── the last level's timeout ──► REJECTED by "timeout"

A parked task holds no worker and no partition: its record is the state, the
offset that brought it is committed once that record is durable, and the
decision or timeout comes back as an event to the ledger (docs/contract.md,
"Delivery").
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any, Sequence

from agents_stream.tables.leases import (
    AWAITING_APPROVAL,
    DEAD_LETTERED,
    REJECTED,
    RUNNING,
    Control,
    DeadLetter,
    Dispatch,
    Effect,
    EmitResult,
    Notify,
    ReleaseOffsets,
    TaskRecord,
)

RISK_ORDER = ("low", "medium", "high", "critical")
DECISIONS = ("approve", "reject")


def needs_approval(
    *,
    always: bool,
    risk_at_least: str | None,
    amount_field: str | None,
    amount_above: float | None,
    saga_flagged: bool,
    risk_level: str | None,
    context_data: dict[str, Any],
) -> str | None:
    """Why a task must wait for a human, or None. Every matching rule is named."""
    reasons = []
    if always:
        reasons.append("policy: always")
    if (
        risk_at_least is not None and risk_level in RISK_ORDER
        and RISK_ORDER.index(risk_level) >= RISK_ORDER.index(risk_at_least)
    ):
        reasons.append(f"risk_level {risk_level} >= {risk_at_least}")
    if amount_field is not None and amount_above is not None:
        # An amount the rule cannot read (missing, "lots", NaN, a list) is not waved through: a human looks.
        amount = _number(context_data.get(amount_field))
        if amount_field not in context_data:
            reasons.append(f"{amount_field} is missing")
        elif amount is None:
            reasons.append(f"{amount_field} is not a number ({context_data[amount_field]!r:.40})")
        elif amount > amount_above:
            reasons.append(f"{amount_field} {amount:g} > {amount_above:g}")
    if saga_flagged:
        reasons.append("saga step flagged for approval")
    return "; ".join(reasons) or None


def _number(value: Any) -> float | None:
    """A finite number from an int, a float or a numeric string; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def state(record: TaskRecord) -> dict[str, Any]:
    return json.loads(record.approval) if record.approval else {}


def _dump(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


def decide(
    record: TaskRecord | None,
    *,
    decision: str,
    by: str,
    via: str,
    comment: str | None,
    now: float,
    me: str,
    ttl: float,
    rejected_result: str,
    signed: bool = True,
) -> tuple[TaskRecord | None, list[Effect]]:
    """A human (or the last timeout) decided. Only the first decision of a parked task counts.

    ``signed`` says whether the decision event carried a valid signature (a worker's, a link's or the CLI's); an
    unsigned one is recorded as such (``signed: false``), so a decision forged on the topic is visible.
    """
    if record is None or record.state != AWAITING_APPROVAL or decision not in DECISIONS:
        return record, []
    approval = state(record)
    made = {
        "decision": decision, "by": by, "via": via, "level": approval.get("level", 0), "signed": signed, "at": now,
    }
    if comment:
        made["comment"] = comment
    approval["decision"] = made
    details = {k: v for k, v in made.items() if k != "at"}
    if approval.get("call"):  # a parked tool call: either way the loop goes on, and the journal says how
        return _resume_call(record, approval, made, now=now, me=me, ttl=ttl), [
            Control("approval.decided", {**details, "call": approval["call"]}), Dispatch(record.dispatch + 1)]
    if decision == "approve":
        running = replace(record, state=RUNNING, dispatch=1, owner=me, lease_until=now + ttl, approval=_dump(approval))
        return running, [Control("approval.decided", details), Dispatch(1)]
    rejected = replace(record, state=REJECTED, result=rejected_result, finished_at=now, approval=_dump(approval))
    return rejected, [Control("approval.decided", details), EmitResult(rejected_result)]


def park_call(
    record: TaskRecord | None, *, dispatch: int, call: dict[str, Any], reason: str, now: float,
    timeouts: list[float],
) -> tuple[TaskRecord | None, list[Effect]]:
    """An agent loop's tool call waits for a human: the task leaves its worker (no lease, its offsets released),
    its journal stays in the record, and a decision or the last timeout resumes it at that call."""
    if record is None or record.state != RUNNING or record.dispatch != dispatch or not timeouts:
        return record, []  # a stale run's report, or a task that moved on
    # Each parking of a task its own millisecond (its identity, ``parked_ms_of``): a decision for the last one
    # never fits this one, however soon the loop parks again.
    now = max(now, float(state(record).get("requested_at", 0.0)) + 0.001)
    approval = {
        "reason": reason, "level": 0, "requested_at": now, "due": now + timeouts[0], "timeouts": list(timeouts),
        "escalations": [], "decision": None, "call": call,
    }
    parked = replace(record, state=AWAITING_APPROVAL, owner="", lease_until=0.0, approval=_dump(approval))
    return parked, [ReleaseOffsets(), Notify(0), Control("approval.requested", {
        "reason": reason, "level": 0, "due": approval["due"], "call": call})]


def _resume_call(
    record: TaskRecord, approval: dict[str, Any], made: dict[str, Any], *, now: float, me: str, ttl: float,
) -> TaskRecord:
    """The decided call's journal entry appended to the task's checkpoint; the task runs again from there."""
    call = approval["call"]
    entry = {"kind": "decision", "turn": call["turn"], "id": call["id"], "decision": made["decision"],
             "by": made["by"], "comment": made.get("comment", "")}
    done = json.loads(record.steps_done) if record.steps_done else []
    return replace(
        record, state=RUNNING, dispatch=record.dispatch + 1, owner=me, lease_until=now + ttl, approval=_dump(approval),
        steps_done=json.dumps([*done, entry], separators=(",", ":")),
    )


def escalate(
    record: TaskRecord | None,
    *,
    level: int,
    timeouts: Sequence[float],
    now: float,
    rejected_result: str,
    me: str = "",
    ttl: float = 0.0,
) -> tuple[TaskRecord | None, list[Effect]]:
    """Level ``level`` let its time run out: ask the next level, or reject at the last.

    ``level`` is the level the timeout was seen at, so a late or repeated
    timeout event (two scanners, a redelivery) changes nothing.
    """
    if record is None or record.state != AWAITING_APPROVAL:
        return record, []
    approval = state(record)
    if approval.get("level") != level or now < approval.get("due", 0.0):
        return record, []
    # the levels as they were when the task was parked: a config change does not strand it
    timeouts = approval.get("timeouts") or timeouts
    nxt = level + 1
    if nxt >= len(timeouts):
        return decide(
            record, decision="reject", by="timeout", via="timeout",
            comment=f"no decision at any of {len(timeouts)} levels", now=now, me=me, ttl=ttl,  # a parked call runs on
            rejected_result=rejected_result,
        )
    approval["escalations"] = [*approval.get("escalations", []), {"from": level, "to": nxt, "at": now}]
    approval["level"] = nxt
    approval["due"] = now + timeouts[nxt]
    escalated = replace(record, approval=_dump(approval))
    return escalated, [Notify(nxt), Control("approval.escalated", {"from": level, "to": nxt, "due": approval["due"]})]


def due(record: TaskRecord, now: float) -> int | None:
    """The level whose timeout has run out, for the scanner; None while the current level still has time."""
    if record.state != AWAITING_APPROVAL:
        return None
    approval = state(record)
    return approval.get("level", 0) if now >= approval.get("due", float("inf")) else None



def parked_ms_of(record: TaskRecord) -> int:
    """The parking's identity: when it was parked, in whole milliseconds (what links carry as ``parked``)."""
    return int(round(float(state(record).get("requested_at", 0.0)) * 1000))


def binding_problem(
    record: TaskRecord, *, here: str, app_id: str | None, agent: str | None, parked: int | None, level: int | None,
) -> str | None:
    """Why an approve or reject does not decide this parked task of app id ``here``, or None when it does.

    A decision names what its human saw: the app id and agent of the task, and the parking (``parked_ms_of``;
    signed links add the level). Every app id reads agent.approvals and two may hold the same task id, so another
    app id's decision decides nothing here. An agent loop parks again at its next guarded call, so a decision
    retried after the first was applied (an HTTP 503 whose event did land) names an earlier parking and decides
    nothing; so does an old link of a task requeued and parked again, or a link of a level escalated since. A
    decision that names none of these (an old client, a hand-written event) is refused: accepting it would decide
    whatever parking is current.
    """
    missing = [name for name, value in (("app_id", app_id), ("agent", agent), ("parked", parked)) if value is None]
    if missing:
        return (
            f"the decision names no {', '.join(missing)}: an approve or reject must name the app id, agent and "
            f"parking it decides (this task: app_id {here}, agent {record.agent}, parked {parked_ms_of(record)}); "
            "send it from the console, POST /approvals/<task_id> with parked, or agents-stream approve|reject --parked"
        )
    if app_id != here:
        return f"the decision is for the task of this id in app id {app_id}; this is app id {here}"
    if agent != record.agent:
        return f"the decision is for a task of agent {agent}; this task is agent {record.agent}'s"
    if parked != parked_ms_of(record):
        return (
            f"the decision is for another parking of this task (parked at {parked} ms; it is parked at "
            f"{parked_ms_of(record)} ms now: an earlier decision was applied and it parked again, or it was "
            "requeued): look at what the task awaits now and decide that parking"
        )
    current = state(record).get("level", 0)
    if level is not None and level != current:
        return f"the decision is for level {level + 1}; the task now awaits level {current + 1}"
    return None


def overflow(
    record: TaskRecord, *, agent: str, partition: int, waiting: int, share: int, now: float, failed_result: str,
) -> tuple[TaskRecord, list[Effect]]:
    """The agent's share of a partition is already parked: the task ends DEAD_LETTERED instead of waiting (its
    producer gets a failed result, the dead letter says why; ``agents-stream dlq requeue`` parks it again)."""
    reason = (
        f"approval_backlog_full: {waiting} tasks of agent {agent} already await approval on partition {partition} "
        f"(at most {share} per partition, AGENTS_STREAM_APPROVAL_MAX_AWAITING): decide or reject some, then requeue"
    )
    ended = replace(
        record, state=DEAD_LETTERED, approval=None, result=failed_result, finished_at=now, dispatch=0, owner="",
        lease_until=0.0,
    )
    details = {"reason": "approval_backlog_full", "waiting": waiting, "share": share}
    return ended, [Control("approval.refused", details), EmitResult(failed_result),
                   DeadLetter(reason, "approval", 0), ReleaseOffsets()]
