"""A tool's breaker, shared by all workers through the circuits log: a tool failing every call is called a bounded
number of times, and then the model is told it is unavailable without a call."""

from __future__ import annotations

import asyncio
from typing import Any

from agents_stream.config import AppConfig
from agents_stream.contract.errors import TransientError
from agents_stream.contract.models import TaskPayload
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.agent_loop import Done, Loop, RunSignals
from agents_stream.execution.plan import AgentPlan, with_tool_circuits
from agents_stream.execution.run import TurnAnswer
from agents_stream.execution.tool_calls import ToolCalling
from agents_stream.execution.tools import ToolContext, tool
from agents_stream.providers.base import Usage
from agents_stream.providers.conversation import Conversation, ToolCall, ToolResult, Turn
from agents_stream.resilience.circuits import Circuits
from agents_stream.testing.memory_circuits_log import MemoryCircuitsLog

CALLS: list[str] = []


@tool(retries=1, breaker={"failure_threshold": 3, "open_timeout_s": 600})
async def carrier(ctx: ToolContext) -> str:
    """The carrier, down."""
    CALLS.append(ctx.key)
    raise TransientError("carrier: 503")


AGENT = Agent("a", "x", tools=[carrier], max_turns=30, max_tool_calls=30, max_tool_errors=30)
BASE = AppConfig.model_validate({"providers": {"local": {"kind": "local"}}, "agents": {"a": {"providers": ["local"]}}})


def loop_plan(agent: Agent) -> AgentPlan:
    """The plan of an agent that runs as a loop, with no MCP server: what with_tool_circuits reads of it."""
    return AgentPlan(config=BASE.agents["a"], tiers=[], light=None, classifier=None, cache=False, partial=False,
                     agent=agent)


def model(calls: int) -> Any:
    """Calls the carrier once a turn for ``calls`` turns, then answers with what the last result said."""
    async def ask(conv: Conversation) -> TurnAnswer:
        results = [m for m in conv.messages if isinstance(m, ToolResult)]
        if len(results) >= calls:
            return TurnAnswer(Turn(results[-1].content, (), Usage(), "f", "m"), "primary:f:m", "high", 1, None)
        turn = Turn("", (ToolCall(f"c{len(results)}", "carrier", {}),), Usage(), "f", "m")
        return TurnAnswer(turn, "primary:f:m", "high", 1, None)
    return ask


async def record(index: int, entry: dict[str, Any]) -> None:
    return None


async def test_a_tool_that_always_fails_opens_its_breaker_for_every_worker() -> None:
    config, names = with_tool_circuits(BASE, {"a": loop_plan(AGENT)})
    assert names == [carrier.circuit] and carrier.circuit.endswith("test_tool_breaker.carrier")
    log = MemoryCircuitsLog()
    workers = []
    for i in range(2):
        c = Circuits(config, ["local", *names], f"w{i}", send=log.send, on_transition=lambda *t: None,
                     on_change=lambda: None, app_id="app")
        log.attach(c)
        workers.append(c)
    CALLS.clear()
    events: list[tuple[str, dict]] = []
    task = TaskPayload(task_id="t-1", agent_name="a", instruction="ship it")
    first = Loop(AGENT, task, [], ask=model(10), record=record,
                 calling=ToolCalling(circuits=workers[0], backoff_base_s=0.001, backoff_cap_s=0.002),
                 signals=RunSignals(on_event=lambda e, d: events.append((e, d))))
    end = await asyncio.wait_for(first.run(), 10)
    print(f"\ntool breaker: 10 turns asked for the failing tool; it was called {len(CALLS)} times")
    assert isinstance(end, Done) and "breaker is open" in str(end.output) and "not called" in str(end.output)
    assert len(CALLS) <= 4, f"the breaker bounds the calls (threshold 3, 1 retry): {len(CALLS)}"
    assert workers[1].state(carrier.circuit) == "open", "the other worker folded the opening from the log"
    before = len(CALLS)
    second = Loop(AGENT, TaskPayload(task_id="t-2", agent_name="a", instruction="ship it"), [], ask=model(2),
                  record=record, calling=ToolCalling(circuits=workers[1]))
    end = await asyncio.wait_for(second.run(), 10)
    assert isinstance(end, Done) and "breaker is open" in str(end.output)
    assert len(CALLS) == before, "a worker that never called the tool does not call it while its breaker is open"
    kinds = [e for e, _ in events]
    assert kinds.count("agent.turn") == 11 and kinds.count("agent.tool_call") == 10
    assert events[1] == ("agent.tool_call", {"turn": 0, "call_id": "c0", "tool": "carrier", "error": True,
                                             "attempts": 2, "detail": "carrier is unavailable (failed 2 times, "
                                                                      "last: TransientError: carrier: 503)"})


@tool(max_concurrency=1)
async def single_lane(ctx: ToolContext) -> str:
    """One call at a time, cluster-wide."""
    IN_FLIGHT.append(1)
    PEAK.append(len(IN_FLIGHT))
    await asyncio.sleep(0.05)
    IN_FLIGHT.pop()
    return "done"


IN_FLIGHT: list[int] = []
PEAK: list[int] = []


async def test_a_tools_concurrency_limit_holds_its_calls_to_it_across_a_turn() -> None:
    """Three calls of one turn to a tool with max_concurrency=1: they run one after another, none refused."""
    agent = Agent("b", "x", tools=[single_lane])
    config, names = with_tool_circuits(BASE, {"b": loop_plan(agent)})
    log = MemoryCircuitsLog()
    circuits = Circuits(config, ["local", *names], "w0", send=log.send, on_transition=lambda *t: None,
                        on_change=lambda: None, app_id="app")
    log.attach(circuits)
    circuits.hello()  # this worker is live: the cluster-wide limit is split among the live workers (one)

    async def ask(conv: Conversation) -> TurnAnswer:
        if any(isinstance(m, ToolResult) for m in conv.messages):
            return TurnAnswer(Turn("ok", (), Usage(), "f", "m"), "primary:f:m", "high", 1, None)
        calls = tuple(ToolCall(f"c{i}", "single_lane", {}) for i in range(3))
        return TurnAnswer(Turn("", calls, Usage(), "f", "m"), "primary:f:m", "high", 1, None)

    PEAK.clear()
    journal: list[Any] = []
    end = await asyncio.wait_for(Loop(agent, TaskPayload(task_id="t", agent_name="b", instruction="x"), journal,
                                      ask=ask, record=record, calling=ToolCalling(circuits=circuits)).run(), 10)
    assert isinstance(end, Done) and max(PEAK) == 1 and len(PEAK) == 3
    assert [e["error"] for e in journal if e["kind"] == "tool"] == [False, False, False]
