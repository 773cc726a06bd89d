"""Agents as tools: the pure waiting for sub-tasks, and a loop that delegates, resumes with their results, and
refuses cycles and chains past max_depth."""

from __future__ import annotations

import json
from typing import Any

from agents_stream.tables import delegation, leases
from agents_stream.tables.leases import AWAITING_SUBTASKS, RUNNING, Dispatch, ReleaseOffsets

from agents_stream.contract.models import ParentRef, TaskPayload
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.agent_loop import Delegated, Done, Loop
from agents_stream.execution.run import TurnAnswer
from agents_stream.execution.tools import ToolContext, agent_tool, tool
from agents_stream.providers.base import Usage
from agents_stream.providers.conversation import Conversation, ToolCall, ToolResult, Turn

PAYLOAD = '{"task_id":"lead-1","agent_name":"lead","instruction":"report"}'
T0 = 1_000.0
SUBTASKS = [("c1", "analyzer", "lead-1/c1", '{"task_id":"lead-1/c1"}'),
            ("c2", "summarizer", "lead-1/c2", '{"task_id":"lead-1/c2"}')]


def running() -> leases.TaskRecord:
    record, _ = leases.receive(
        None, leases.TaskMessage(agent="lead", payload=PAYLOAD, topic="agent.tasks.lead", partition=0, offset=3),
        now=T0, me="w1", ttl=30.0, max_attempts=3, running_here=False,
    )
    return record


def test_a_delegating_task_waits_without_a_lease_and_publishes_its_subtasks() -> None:
    parked, effects = delegation.delegate(running(), dispatch=1, turn=0, subtasks=SUBTASKS)
    assert parked is not None and parked.state == AWAITING_SUBTASKS and parked.lease_until == 0 and parked.owner == ""
    assert delegation.waiting_for(parked) == {"c1": "analyzer", "c2": "summarizer"}
    assert isinstance(effects[0], ReleaseOffsets)
    assert [(e.agent, e.task_id) for e in effects if isinstance(e, delegation.SendTask)] == [
        ("analyzer", "lead-1/c1"), ("summarizer", "lead-1/c2")]
    again, resent = delegation.delegate(parked, dispatch=1, turn=0, subtasks=SUBTASKS)
    assert again is parked and len(resent) == 2, "the same report again re-sends what is still awaited"
    stale, none = delegation.delegate(running(), dispatch=7, turn=0, subtasks=SUBTASKS)
    assert none == [] and stale is not None and stale.state == RUNNING


def test_results_are_journaled_as_they_come_and_the_last_resumes_the_loop() -> None:
    parked, _ = delegation.delegate(running(), dispatch=1, turn=0, subtasks=SUBTASKS)
    result = {"task_id": "lead-1/c1", "status": "succeeded", "output": "fine"}

    def arrive(record: Any, call_id: str, agent: str) -> Any:
        arrived = delegation.CallResult(f"lead-1/{call_id}", call_id, agent, result)
        return delegation.arrive(record, arrived, task_id="lead-1", now=T0 + 5, me="w2", ttl=30.0)

    one, effects = arrive(parked, "c1", "analyzer")
    assert one.state == AWAITING_SUBTASKS and effects == [] and delegation.waiting_for(one) == {"c2": "summarizer"}
    assert json.loads(one.steps_done)[-1] == {"kind": "subresult", "turn": 0, "id": "c1", "agent": "analyzer",
                                             "result": result}
    assert arrive(one, "c1", "analyzer") == (one, []), "a duplicate changes nothing"
    assert arrive(one, "c2", "analyzer") == (one, []), "a result from another agent than the call's is refused"
    done, effects = arrive(one, "c2", "summarizer")
    assert done.state == RUNNING and done.dispatch == 2 and done.owner == "w2" and Dispatch(2) in effects
    assert len(json.loads(done.steps_done)) == 2 and done.waiting is not None, "its timer keeps finding it"


@tool
async def notes(ctx: ToolContext) -> str:
    """The lead's own notes."""
    return "notes"


LEAD = Agent("lead", "Delegate.", tools=[agent_tool("analyzer", "Analyse a text."),
                                         agent_tool("summarizer", "Summarise a text."), notes], max_depth=3)


def model(conv: Conversation) -> Turn:
    results = {m.call_id: m for m in conv.messages if isinstance(m, ToolResult)}
    if not results:
        return Turn("", (ToolCall("c1", "analyzer", {"instruction": "analyse", "context": {"doc": "d"}}),
                         ToolCall("c2", "summarizer", {"instruction": "summarise"}), ToolCall("c3", "notes", {})),
                    Usage(), "f", "m")
    return Turn(" | ".join(f"{k}={'ERR ' if r.error else ''}{r.content}" for k, r in sorted(results.items())), (),
                Usage(), "f", "m")


async def ask(conv: Conversation) -> TurnAnswer:
    return TurnAnswer(model(conv), "primary:f:m", "high", 1, None)


async def record(index: int, entry: dict[str, Any]) -> None:
    return None


async def test_a_loop_delegates_its_agent_calls_and_resumes_with_their_results() -> None:
    task = TaskPayload(task_id="lead-1", agent_name="lead", instruction="report")
    journal: list[Any] = []
    end = await Loop(LEAD, task, journal, ask=ask, record=record).run()
    assert end == Delegated(0, (
        {"id": "c1", "agent": "analyzer", "instruction": "analyse", "context": {"doc": "d"}},
        {"id": "c2", "agent": "summarizer", "instruction": "summarise", "context": None},
    ))
    assert [e["id"] for e in journal if e["kind"] == "tool"] == ["c3"], "the lead's own tool ran meanwhile"
    journal += [
        {"kind": "subresult", "turn": 0, "id": "c2", "agent": "summarizer",
         "result": {"status": "failed", "error": "every provider down"}},
        {"kind": "subresult", "turn": 0, "id": "c1", "agent": "analyzer",
         "result": {"status": "succeeded", "output": {"verdict": "ok"}}},
    ]
    end = await Loop(LEAD, task, journal, ask=ask, record=record).run()
    assert end == Done('c1={"verdict": "ok"} | c2=ERR agent summarizer failed: every provider down | c3=notes',
                       "high", "primary:f:m")


async def test_a_cycle_or_a_chain_at_max_depth_is_told_to_the_model_not_delegated() -> None:
    in_a_cycle = TaskPayload(task_id="x/c9", agent_name="lead", instruction="r",
                             parent=ParentRef(task_id="x", app_id="a", call_id="c9", lineage=["analyzer"]))
    journal: list[Any] = []
    end = await Loop(LEAD, in_a_cycle, journal, ask=ask, record=record).run()
    assert isinstance(end, Delegated) and [c["agent"] for c in end.calls] == ["summarizer"]
    refused = next(e for e in journal if e.get("id") == "c1")
    assert refused["error"] and "already in the chain analyzer → lead" in refused["content"]
    deep = TaskPayload(task_id="y/c9", agent_name="lead", instruction="r",
                       parent=ParentRef(task_id="y", app_id="a", call_id="c9", lineage=["top", "middle"]))
    journal = []
    end = await Loop(LEAD, deep, journal, ask=ask, record=record).run()
    assert isinstance(end, Done), "nothing may be delegated at depth 3: the model hears why and answers"
    assert "max_depth 3" in str(end.output)
