"""Approval per tool call: the task parks at the call (pure transitions), and the loop runs an approved call once and
tells the model of a rejected one."""

from __future__ import annotations

import json
from typing import Any

from agents_stream.tables import approvals, leases
from agents_stream.tables.leases import AWAITING_APPROVAL, RUNNING, Control, Dispatch, Notify, ReleaseOffsets

from agents_stream.contract.models import TaskPayload
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.agent_loop import Done, Failed, Loop, Parked
from agents_stream.execution.run import TurnAnswer
from agents_stream.execution.tools import ToolContext, tool
from agents_stream.providers.base import Usage
from agents_stream.providers.conversation import Conversation, ToolCall, ToolResult, Turn

PAYLOAD = '{"task_id":"t-1","agent_name":"support","instruction":"refund"}'
T0 = 1_000.0
CALL = {"turn": 1, "id": "c9", "tool": "refund"}


def running(dispatch: int = 2) -> leases.TaskRecord:
    record, _ = leases.receive(
        None, leases.TaskMessage(agent="support", payload=PAYLOAD, topic="agent.tasks.support", partition=0, offset=3),
        now=T0, me="w1", ttl=30.0, max_attempts=3, running_here=False,
    )
    record, _ = leases.checkpoint(record, index=0, output={"kind": "turn", "turn": 0})
    return leases.TaskRecord(**{**record.to_json(), "dispatch": dispatch}) if dispatch != 1 else record


def test_a_parked_call_leaves_its_worker_and_keeps_its_journal() -> None:
    record = running()
    parked, effects = approvals.park_call(record, dispatch=2, call=CALL, reason="amount 500 > 100", now=T0,
                                          timeouts=[10.0, 20.0])
    assert parked is not None and parked.state == AWAITING_APPROVAL and parked.owner == "" and parked.lease_until == 0
    assert parked.steps_done == record.steps_done and parked.dispatch == 2
    assert approvals.state(parked)["call"] == CALL and approvals.due(parked, T0 + 10) == 0
    assert isinstance(effects[0], ReleaseOffsets), "its offsets are released: no partition is held behind it"
    assert isinstance(effects[1], Notify) and isinstance(effects[2], Control)
    stale, none = approvals.park_call(record, dispatch=1, call=CALL, reason="x", now=T0, timeouts=[10.0])
    assert stale is record and none == [], "an earlier dispatch's report changes nothing"


def test_either_decision_resumes_the_loop_with_the_decision_journaled() -> None:
    parked, _ = approvals.park_call(running(), dispatch=2, call=CALL, reason="r", now=T0, timeouts=[10.0])
    for decision, comment in (("approve", None), ("reject", "too much")):
        new, effects = approvals.decide(parked, decision=decision, by="bob", via="http", comment=comment,
                                        now=T0 + 1, me="w2", ttl=30.0, rejected_result="{}")
        assert new is not None and new.state == RUNNING and new.dispatch == 3 and new.owner == "w2"
        entry = json.loads(new.steps_done or "[]")[-1]
        assert entry == {"kind": "decision", "turn": 1, "id": "c9", "decision": decision, "by": "bob",
                         "comment": comment or ""}
        assert Dispatch(3) in effects and new.result is None, "not a result: the loop goes on"


def test_the_last_levels_timeout_rejects_the_call_and_the_loop_goes_on_here() -> None:
    parked, _ = approvals.park_call(running(), dispatch=2, call=CALL, reason="r", now=T0, timeouts=[10.0])
    assert parked is not None
    new, effects = approvals.escalate(parked, level=0, timeouts=[10.0], now=T0 + 11, rejected_result="{}",
                                      me="w1", ttl=30.0)
    assert new is not None and new.state == RUNNING and new.owner == "w1" and new.lease_until == T0 + 41
    assert json.loads(new.steps_done or "[]")[-1]["by"] == "timeout" and Dispatch(3) in effects


REFUNDS: list[tuple[str, float]] = []


@tool(approval=lambda a: f"amount {a.amount:g} > 100" if a.amount > 100 else None)
async def refund(ctx: ToolContext, order_id: str, amount: float) -> str:
    """Refund an order."""
    REFUNDS.append((ctx.key, amount))
    return f"refunded {amount:g}"


@tool(approval=True, on_reject="fail")
async def close_account(ctx: ToolContext) -> str:
    """Close the account."""
    return "closed"


@tool
async def lookup(ctx: ToolContext, order_id: str) -> str:
    """Look up."""
    return "found"


AGENT = Agent("support", "x", tools=[refund, close_account, lookup])
TASK = TaskPayload(task_id="t-1", agent_name="support", instruction="refund")
SEEN: list[str] = []


async def ask(conv: Conversation) -> TurnAnswer:
    results = [m for m in conv.messages if isinstance(m, ToolResult)]
    if not results:
        turn = Turn("", (ToolCall("a", "refund", {"order_id": "o", "amount": 500.0}),
                         ToolCall("b", "lookup", {"order_id": "o"}), ToolCall("s", "refund",
                                                                              {"order_id": "o", "amount": 5.0})),
                    Usage(), "f", "m")
    else:
        SEEN.append(next(r.content for r in results if r.call_id == "a"))
        turn = Turn("done", (), Usage(), "f", "m")
    return TurnAnswer(turn, "primary:f:m", "high", 1, None)


async def record(index: int, entry: dict[str, Any]) -> None:
    return None


async def test_a_call_over_its_approval_rule_parks_after_the_others_of_its_turn_ran() -> None:
    REFUNDS.clear()
    journal: list[Any] = []
    end = await Loop(AGENT, TASK, journal, ask=ask, record=record).run()
    assert end == Parked(0, "a", "refund", "tool refund: amount 500 > 100")
    assert sorted(e["id"] for e in journal if e["kind"] == "tool") == ["b", "s"], "the calls that need no one ran"
    assert [k for k, _ in REFUNDS] == ["t-1:0:s"], "the small refund needed no approval"
    again = await Loop(AGENT, TASK, journal, ask=ask, record=record).run()
    assert again == end and len(REFUNDS) == 1, "without a decision it parks again, at the same call"


async def test_an_approved_call_runs_once_and_a_rejected_one_is_told_to_the_model() -> None:
    for decision, expected in (("approve", "refunded 500"), ("reject", "rejected by bob: too much")):
        REFUNDS.clear()
        SEEN.clear()
        journal: list[Any] = []
        await Loop(AGENT, TASK, journal, ask=ask, record=record).run()
        journal.append({"kind": "decision", "turn": 0, "id": "a", "decision": decision, "by": "bob",
                        "comment": "too much" if decision == "reject" else ""})
        end = await Loop(AGENT, TASK, journal, ask=ask, record=record).run()
        assert end == Done("done", "high", "primary:f:m")
        assert SEEN == [expected]
        big = [k for k, amount in REFUNDS if amount == 500]
        assert big == (["t-1:0:a"] if decision == "approve" else []), "approved: once; rejected: never"


async def test_a_rejected_call_of_a_fail_on_reject_tool_fails_the_task() -> None:
    async def closing(conv: Conversation) -> TurnAnswer:
        return TurnAnswer(Turn("", (ToolCall("z", "close_account", {}),), Usage(), "f", "m"), "p", "high", 1, None)

    journal: list[Any] = []
    assert await Loop(AGENT, TASK, journal, ask=closing, record=record).run() == Parked(
        0, "z", "close_account", "tool close_account: every call is approved first")
    journal.append({"kind": "decision", "turn": 0, "id": "z", "decision": "reject", "by": "carol", "comment": ""})
    end = await Loop(AGENT, TASK, journal, ask=closing, record=record).run()
    assert isinstance(end, Failed) and end.reason.startswith("tool_failed") and "rejected by carol" in end.error
