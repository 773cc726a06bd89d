"""Replaying a recorded run against changed agent code (agents_stream.testing.replay): the same code replays
clean; a changed prompt, a removed tool, new arguments, a new approval or a lower limit diverge at the step where
the new code parts from the recording. Nothing runs and nothing is asked during a replay."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agents_stream import Agent, ToolContext, tool
from agents_stream.testing import AgentRun, ReplayDivergence, ScriptedModel, call, replay, run_agent, turn

ran: list[str] = []


@tool
async def lookup_order(ctx: ToolContext, order_id: str) -> dict[str, Any]:
    """Look an order up."""
    ran.append("lookup_order")
    return {"order_id": order_id, "amount": 42.5}


@tool
async def refund(ctx: ToolContext, order_id: str, amount: float) -> str:
    """Refund an order."""
    ran.append("refund")
    return "refunded"


@tool
async def notify(ctx: ToolContext, text: str) -> str:
    """Write to the customer."""
    ran.append("notify")
    return "sent"


INSTRUCTIONS = "You refund orders. Look the order up first."
SUPPORT = Agent("support", instructions=INSTRUCTIONS, tools=[lookup_order, refund, notify])


async def recorded() -> AgentRun:
    run = await run_agent(SUPPORT, "Refund order o-1", model=ScriptedModel([
        call("lookup_order", order_id="o-1"),
        turn(call("refund", order_id="o-1", amount=42.5), call("notify", text="done")),
        "Refunded 42.50.",
    ]))
    assert run.status == "succeeded"
    return run


async def test_the_same_code_replays_clean_from_a_saved_recording_without_running_anything() -> None:
    saved = json.loads(json.dumps((await recorded()).recording()))  # as kept in a file beside the test
    ran.clear()
    report = await replay(SUPPORT, saved)
    assert not report.diverged and report.turns == 3 and ran == []
    report.check()


async def test_a_changed_prompt_diverges_at_the_first_turn() -> None:
    changed = Agent("support", instructions=INSTRUCTIONS + " Never refund more than 10.",
                    tools=[lookup_order, refund, notify])
    report = await replay(changed, await recorded())
    assert report.first is not None and report.first.turn == 0
    assert "system text / instructions changed" in report.first.what
    assert report.turns == 3  # a prompt change alone does not stop the replay: every later turn is compared too
    with pytest.raises(ReplayDivergence, match="turn 0"):
        report.check()


async def test_a_removed_tool_diverges_at_its_call() -> None:
    changed = Agent("support", instructions=INSTRUCTIONS, tools=[lookup_order, notify])
    run = await recorded()
    report = await replay(changed, run.journal)  # a worker's journal has no requests: calls are what is checked
    assert str(report.first).startswith("turn 1, call call_1_0 (refund): calls tool 'refund', which this code")
    assert len(report.divergences) == 1 and report.version != report.versions[0]
    # with the recorded requests, the tools offered differ from the first turn on, and the call stops the replay
    with_requests = await replay(changed, run)
    assert with_requests.first is not None and with_requests.first.turn == 0
    assert "removed refund" in with_requests.first.what
    assert with_requests.divergences[-1].call_id == "call_1_0"


async def test_changed_arguments_an_approval_and_a_lower_limit_each_diverge_where_they_bite() -> None:
    run = await recorded()

    @tool(name="refund")
    async def refund_cents(ctx: ToolContext, order_id: str, cents: int) -> str:
        """Refund an order."""
        return "refunded"

    report = await replay(Agent("support", instructions=INSTRUCTIONS, tools=[lookup_order, refund_cents, notify]),
                          run.journal)
    assert report.first is not None and (report.first.turn, report.first.tool) == (1, "refund")
    assert "refuses the recorded arguments" in report.first.what

    approved = tool(name="refund", approval=True)(refund.fn)
    report = await replay(Agent("support", instructions=INSTRUCTIONS, tools=[lookup_order, approved, notify]),
                          run.journal)
    assert report.first is not None and (report.first.turn, report.first.call_id) == (1, "call_1_0")
    assert "waits for a human" in report.first.what

    report = await replay(Agent("support", instructions=INSTRUCTIONS, tools=[lookup_order, refund, notify],
                                max_turns=2), run.journal)
    assert report.first is not None and report.first.turn == 1 and "max_turns" in report.first.what


async def test_a_transcript_from_a_result_replays_by_tool_names() -> None:
    run = await recorded()
    result = {"task_id": "test-1", "status": "succeeded", "transcript": run.transcript}  # a TaskResult's JSON
    assert not (await replay(SUPPORT, result)).diverged
    shown = {"task_id": "test-1", "result": result}  # `agents-stream tasks show test-1 --json`
    report = await replay(Agent("support", instructions=INSTRUCTIONS, tools=[lookup_order, refund]), shown)
    assert str(report.first).startswith("turn 1, call call_1_1 (notify): calls tool 'notify'")


async def test_an_output_model_dropped_or_added_diverges_at_the_answer() -> None:
    from pydantic import BaseModel

    class Refunded(BaseModel):
        amount: float

    strict = Agent("support", instructions=INSTRUCTIONS, tools=[lookup_order], output_model=Refunded)
    run = await run_agent(strict, "Refund", model=["42.5", '{"amount": 42.5}'])  # corrected once
    assert run.status == "succeeded" and not (await replay(strict, run.journal)).diverged
    loose = Agent("support", instructions=INSTRUCTIONS, tools=[lookup_order])
    report = await replay(loose, run.journal)
    assert str(report.first) == "turn 0: this code finishes here; the recording went on to turn 1"
    plain = await run_agent(loose, "Refund", model=["42.5"])
    report = await replay(strict, plain.journal)
    assert report.first is not None and report.first.turn == 1
    assert "asks the model for turn 1 (it told the model: Your final answer was rejected" in report.first.what
