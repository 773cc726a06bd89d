"""A routed agent's task whose handler's tool asks for approval waits under that handler's approval levels
(ledger/gate.py): the routed agent itself has none, and its journal names the handler."""

from __future__ import annotations

import json
from types import SimpleNamespace

from agents_stream.tables.leases import TaskRecord

from agents_stream.config import ApprovalLevel, ApprovalPolicy
from agents_stream.ledger.gate import ApprovalGate

SUPPORT = ApprovalPolicy(levels=[ApprovalLevel(name="lead", timeout_s=60)])
DESK = ApprovalPolicy(always=True, levels=[ApprovalLevel(name="desk-lead", timeout_s=60)])


def _record(agent: str, entries: list[object] | None) -> TaskRecord:
    return TaskRecord(state="running", agent=agent, dispatch=1, owner="w1", lease_until=0.0, payload="{}",
                      topic=f"agent.tasks.{agent}", partition=0, offset=0, received_at=0.0,
                      steps_done=json.dumps(entries, separators=(",", ":")) if entries is not None else None)


def test_a_routed_tasks_call_waits_under_its_handlers_policy() -> None:
    gate = SimpleNamespace(policies={"support": SUPPORT})
    route = {"kind": "route", "turn": -1, "handler": "faq", "by": "rule", "reason": "r"}
    escalated = {"kind": "escalated", "turn": -1, "from": "faq", "to": "support", "reason": "it failed"}
    assert ApprovalGate._policy(gate, _record("desk", [route, escalated])) is SUPPORT  # type: ignore[arg-type]
    assert ApprovalGate._policy(gate, _record("desk", [route])) is None  # type: ignore[arg-type]
    assert ApprovalGate._policy(gate, _record("desk", None)) is None  # type: ignore[arg-type]
    assert ApprovalGate._policy(gate, _record("support", None)) is SUPPORT  # type: ignore[arg-type]


def test_the_routed_agents_own_policy_wins() -> None:
    gate = SimpleNamespace(policies={"support": SUPPORT, "desk": DESK})
    route = {"kind": "route", "turn": -1, "handler": "support", "by": "rule", "reason": "r"}
    assert ApprovalGate._policy(gate, _record("desk", [route])) is DESK  # type: ignore[arg-type]
