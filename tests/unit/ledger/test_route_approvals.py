"""A routed agent's task whose handler's tool asks for approval waits under that handler's approval levels
(ledger/gate.py): the routed agent itself has none, and its journal names the handler."""

from __future__ import annotations

import json

from agents_stream.tables.leases import TaskRecord

from agents_stream.config import ApprovalLevel, ApprovalPolicy
from agents_stream.ledger.cancel_decisions import Cancellation
from agents_stream.ledger.gate import ApprovalGate
from agents_stream.ops.notify import Notifier
from agents_stream.settings import Settings
from tests.unit.ledger_fakes import PlainTable, recording_outbox

SUPPORT = ApprovalPolicy(levels=[ApprovalLevel(name="lead", timeout_s=60)])
DESK = ApprovalPolicy(always=True, levels=[ApprovalLevel(name="desk-lead", timeout_s=60)])


def _record(agent: str, entries: list[object] | None) -> TaskRecord:
    return TaskRecord(state="running", agent=agent, dispatch=1, owner="w1", lease_until=0.0, payload="{}",
                      topic=f"agent.tasks.{agent}", partition=0, offset=0, received_at=0.0,
                      steps_done=json.dumps(entries, separators=(",", ":")) if entries is not None else None)


def _gate(policies: dict[str, ApprovalPolicy]) -> ApprovalGate:
    """A gate with these approval policies (its table, outbox and notifier are never used here)."""
    outbox, _ = recording_outbox()
    return ApprovalGate(Settings(), "w1", PlainTable(), outbox, Notifier(), policies=policies, saga_flagged=set(),
                        awaiting_in=lambda tp, agent: 0, cancellation=Cancellation(Settings(), outbox, set()))


def test_a_routed_tasks_call_waits_under_its_handlers_policy() -> None:
    gate = _gate({"support": SUPPORT})
    route = {"kind": "route", "turn": -1, "handler": "faq", "by": "rule", "reason": "r"}
    escalated = {"kind": "escalated", "turn": -1, "from": "faq", "to": "support", "reason": "it failed"}
    assert gate.policy_of(_record("desk", [route, escalated])) is SUPPORT
    assert gate.policy_of(_record("desk", [route])) is None
    assert gate.policy_of(_record("desk", None)) is None
    assert gate.policy_of(_record("support", None)) is SUPPORT


def test_the_routed_agents_own_policy_wins() -> None:
    gate = _gate({"support": SUPPORT, "desk": DESK})
    route = {"kind": "route", "turn": -1, "handler": "support", "by": "rule", "reason": "r"}
    assert gate.policy_of(_record("desk", [route])) is DESK
