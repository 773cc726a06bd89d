"""Decisions bound to what their human saw: an approve or reject names the app id, the agent
and the parking it decides, and the ledger applies it only to that parking of that app id's task of that agent; a
cancel names its app id (or, a caller's, the agent). Through the ledger with fake tables, no broker."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

from agents_stream.tables import approvals, leases
from agents_stream.tables.definitions import Tables
from faust.types import TP

from agents_stream.config import ApprovalLevel, ApprovalPolicy
from agents_stream.contract import topics
from agents_stream.contract.events import CallParked, encode
from agents_stream.contract.models import ApprovalDecision, TaskPayload
from agents_stream.ledger.app_agents import AppAgents
from agents_stream.ledger.ledger import Ledger
from agents_stream.ops.notify import Notifier, with_signature
from agents_stream.settings import Settings
from tests.unit.ledger_fakes import FakeRuns, LedgerHarness, Table, faust_event, recording_outbox

SECRET = "s" * 32
SETTINGS = Settings(approval_secret=SECRET, partitions=1)
APP = SETTINGS.app_id
MINE = TP(topics.outcomes_topic(APP), 0)
DECISIONS = TP(topics.APPROVALS, 0)
TASK = TaskPayload(task_id="t-1", agent_name="support", instruction="refund order 7")


def _ledger() -> LedgerHarness:
    outbox, sent = recording_outbox()
    tasks = Table()
    policy = ApprovalPolicy(levels=[ApprovalLevel(name="lead", timeout_s=600)])
    runs = FakeRuns()
    ledger = Ledger(SETTINGS, executor=runs, worker_id="w1",
                    tables=Tables(tasks=tasks, answers=Table(), jobs=Table(), timers=Table()),
                    watermark=outbox.watermark, outbox=outbox, notifier=Notifier(),
                    agents=AppAgents(policies={"support": policy}))
    tasks["t-1"] = leases.TaskRecord(
        state=leases.RUNNING, agent="support", dispatch=2, owner="w1", lease_until=1e12,
        payload=TASK.model_dump_json(), topic=topics.task_topic("support"), partition=0, offset=4, received_at=0.0,
    ).to_json()
    return LedgerHarness(ledger, tasks, sent, runs)


def _handle(f: LedgerHarness, tp: TP, value: bytes) -> None:
    """The next record of ``tp`` (each partition's offsets in a row, as the consumer reads them)."""
    f.offsets[tp] = f.offsets.get(tp, 0) + 1
    f.ledger.handle(faust_event(tp, f.offsets[tp], b"t-1", value))


def _park(f: LedgerHarness, call_id: str, reason: str) -> int:
    """The loop's run reports a guarded call: the task parks at it. Returns the parking, as /approvals shows it."""
    dispatch = leases.TaskRecord.from_json(f.tasks["t-1"]).dispatch
    _handle(f, MINE, encode(CallParked(worker="w1", dispatch=dispatch, turn=dispatch, call_id=call_id, tool="refund",
                                       reason=reason)))
    record = leases.TaskRecord.from_json(f.tasks["t-1"])
    assert record.state == leases.AWAITING_APPROVAL and approvals.state(record)["call"]["id"] == call_id
    return approvals.parked_ms_of(record)


def _decision(verb: Literal["approve", "reject", "cancel"] = "approve", **fields: Any) -> bytes:
    decision = ApprovalDecision(task_id="t-1", decision=verb, by="ann", via="http", **fields)
    return with_signature(SECRET, decision).model_dump_json(exclude_none=True).encode()


def _state(f: LedgerHarness) -> tuple[str, dict[str, Any]]:
    record = leases.TaskRecord.from_json(f.tasks["t-1"])
    return record.state, approvals.state(record)


def _controls(f: LedgerHarness, event: str) -> list[dict[str, Any]]:
    said = [json.loads(v or b"") for t, v in f.sent if t == topics.CONTROL]
    return [c for c in said if c["event"] == event]


async def _spin() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_a_retried_approve_does_not_decide_the_loops_next_parked_call() -> None:
    """refund(50) parks, is approved; the loop goes on and parks refund(900). The same approve sent again (a client
    retrying after an HTTP 503 whose event did land) names the first parking: the 900 call stays parked."""
    f = _ledger()
    first = _park(f, "call_50", "amount 50 > 10")
    approve = _decision(app_id=APP, agent="support", parked=first)
    _handle(f, DECISIONS, approve)
    await _spin()
    assert _state(f)[0] == leases.RUNNING, "the decision of what its human saw is applied"
    second = _park(f, "call_900", "amount 900 > 10")
    assert second != first
    _handle(f, DECISIONS, approve)  # the retry
    await _spin()
    state, approval = _state(f)
    assert state == leases.AWAITING_APPROVAL and approval["call"]["id"] == "call_900" and approval["decision"] is None
    [ignored] = _controls(f, "approval.ignored")
    assert "another parking" in ignored["details"]["reason"] and str(second) in ignored["details"]["reason"]
    _handle(f, DECISIONS, _decision("reject", app_id=APP, agent="support", parked=second))
    await _spin()
    assert _state(f)[1]["decision"]["decision"] == "reject", "a decision naming the current parking decides it"


async def test_a_decision_for_another_app_ids_task_of_the_same_id_decides_nothing_here() -> None:
    """Every app id reads agent.approvals; app B's decision on its task t-1 does not decide this app's t-1."""
    f = _ledger()
    parked = _park(f, "call_1", "amount 50 > 10")
    _handle(f, DECISIONS, _decision(app_id="app-b", agent="support", parked=parked))
    await _spin()
    assert _state(f)[0] == leases.AWAITING_APPROVAL
    [ignored] = _controls(f, "approval.ignored")
    assert ignored["details"]["reason"] == (
        f"the decision is for the task of this id in app id app-b; this is app id {APP}")


async def test_a_decision_naming_no_app_id_agent_or_parking_is_refused_naming_what_it_lacks() -> None:
    """An old client or a hand-written event: refused, since applying it would decide whatever parking is current."""
    f = _ledger()
    parked = _park(f, "call_1", "amount 50 > 10")
    _handle(f, DECISIONS, json.dumps({"task_id": "t-1", "decision": "approve", "by": "ann"}).encode())
    _handle(f, DECISIONS, _decision(app_id=APP, parked=parked))
    _handle(f, DECISIONS, _decision(app_id=APP, agent="billing", parked=parked))
    await _spin()
    assert _state(f)[0] == leases.AWAITING_APPROVAL
    reasons = [c["details"]["reason"] for c in _controls(f, "approval.ignored")]
    assert reasons[0].startswith("the decision names no app_id, agent, parked:")
    assert f"parked {parked}" in reasons[0], "it says what the task awaits now"
    assert reasons[1].startswith("the decision names no agent:")
    assert reasons[2] == "the decision is for a task of agent billing; this task is agent support's"


def test_a_loop_that_parks_again_within_the_same_millisecond_has_a_new_parking() -> None:
    record = leases.TaskRecord(state=leases.RUNNING, agent="support", dispatch=2, owner="w1", lease_until=1e12,
                               payload=TASK.model_dump_json(), topic="t", partition=0, offset=0, received_at=0.0)
    call = {"turn": 1, "id": "a", "tool": "refund"}
    first, _ = approvals.park_call(record, dispatch=2, call=call, reason="r", now=5.0, timeouts=[60.0])
    assert first is not None
    resumed, _ = approvals.decide(first, decision="approve", by="ann", via="http", comment=None, now=5.0, me="w1",
                                  ttl=30.0, rejected_result="{}")
    assert resumed is not None
    again, _ = approvals.park_call(resumed, dispatch=3, call={**call, "id": "b"}, reason="r", now=5.0,
                                   timeouts=[60.0])
    assert again is not None and approvals.parked_ms_of(again) > approvals.parked_ms_of(first)


async def test_a_cancel_for_another_app_id_or_naming_neither_app_id_nor_agent_changes_nothing() -> None:
    """A cancel is for a task, not a parking: it names the app id (people's) or the agent (a caller's)."""
    f = _ledger()
    _handle(f, DECISIONS, _decision("cancel", app_id="app-b"))
    _handle(f, DECISIONS, _decision("cancel"))
    _handle(f, DECISIONS, _decision("cancel", agent="billing"))
    await _spin()
    assert _state(f)[0] == leases.RUNNING
    reasons = [c["details"]["reason"] for c in _controls(f, "task.cancel_ignored")]
    assert reasons[0] == f"the cancel is for the task of this id in app id app-b; this is app id {APP}"
    assert reasons[1].startswith("the cancel names no app_id and no agent")
    assert reasons[2] == "the cancel is for a task of agent billing; this task is agent support's"
    _handle(f, DECISIONS, _decision("cancel", agent="support"))  # a caller's cancel of its sub-task
    await _spin()
    assert _state(f)[0] == leases.CANCELLED
