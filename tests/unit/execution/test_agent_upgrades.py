"""Upgrades while loops run: the agent's version in the journal, and what new code does with a journal old code
began (the pure rule of tables/journal.py, then the loop on a journal a crash left behind, without I/O)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest
from agents_stream.tables import journal
from agents_stream.tables.journal import AskModel, Code, Fail, Limits, RunTools
from pydantic import BaseModel

from agents_stream.contract.models import TaskPayload
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.agent_loop import Done, Failed, Loop, transcript
from agents_stream.execution.run import TurnAnswer
from agents_stream.execution.tools import ToolContext, tool
from agents_stream.providers.base import Usage
from agents_stream.providers.conversation import AssistantTurn, Conversation, ToolCall, Turn

LIMITS = Limits(max_turns=8, max_tool_calls=10, max_tool_errors=3, format_retries=1)


def turn(n: int, *calls: tuple[str, str, dict[str, Any]], version: str | None = "v1") -> dict[str, Any]:
    entry: dict[str, Any] = {
        "kind": "turn", "turn": n, "text": "", "source": "primary:fake:m", "confidence": "high", "provider_calls": 1,
        "usage": {"input_tokens": 1, "output_tokens": 1, "cost": None},
        "calls": [{"id": i, "name": name, "arguments": args} for i, name, args in calls],
    }
    if version is not None:
        entry["version"] = version
    return entry


def result(n: int, call_id: str, name: str) -> dict[str, Any]:
    return {"kind": "tool", "turn": n, "id": call_id, "name": name, "content": "ok", "error": False,
            "fatal": False, "attempts": 1}


def code(version: str, *tools: str) -> Code:
    """Code that has ``tools``; each refuses arguments with a "bad" key."""
    def refuses(call: dict[str, Any]) -> str | None:
        if call["name"] not in tools:
            return f"tool {call['name']!r}, which this version of agent 'support' does not have"
        if "bad" in call["arguments"]:
            return f"tool {call['name']!r} with arguments this version refuses (bad)"
        return None
    return Code("support", version, refuses)


def action(entries: list[Any], running: Code) -> Any:
    return journal.next_action(journal.replay(entries), LIMITS, running)


# The pure rule.

def test_a_call_the_same_version_cannot_run_is_the_models_mistake_and_runs_to_tell_it() -> None:
    entries = [turn(0, ("c1", "made_up", {}))]
    assert action(entries, code("v1", "refund")) == RunTools(0, tuple(entries[0]["calls"]))


def test_a_pending_call_of_a_tool_the_new_version_lacks_fails_the_task_naming_both_versions() -> None:
    entries = [turn(0, ("c0", "lookup", {})), result(0, "c0", "lookup"), turn(1, ("c1", "refund_v1", {"n": 1}))]
    got = action(entries, code("v2", "lookup", "refund"))
    assert isinstance(got, Fail) and got.reason == "agent_upgrade"
    assert got.error.startswith("the journal's next step (turn 1, call c1) calls tool 'refund_v1', which this "
                                "version of agent 'support' does not have (journal version v1, code version v2)")
    assert "renamed" in got.error, "the failure says what the author can do"


def test_a_journal_from_before_versions_were_recorded_counts_as_another_version() -> None:
    entries = [turn(0, ("c1", "refund_v1", {}), version=None)]
    got = action(entries, code("v2", "refund"))
    assert isinstance(got, Fail) and got.reason == "agent_upgrade" and "journal version unrecorded" in got.error


def test_a_pending_call_the_new_version_can_run_runs_and_journaled_results_are_facts() -> None:
    pending = [turn(0, ("c1", "refund", {"n": 1}))]
    assert action(pending, code("v2", "refund", "apologize")) == RunTools(0, tuple(pending[0]["calls"]))
    # the removed tool's call has its result: nothing is pending, the next turn is asked of the new code
    done = [turn(0, ("c1", "refund_v1", {})), result(0, "c1", "refund_v1")]
    assert action(done, code("v2", "refund")) == AskModel(1)


def test_arguments_the_new_schema_refuses_fail_the_task_and_no_call_of_the_turn_runs() -> None:
    entries = [turn(0, ("c1", "lookup", {}), ("c2", "refund", {"bad": 1}))]
    got = action(entries, code("v2", "lookup", "refund"))
    assert isinstance(got, Fail) and got.reason == "agent_upgrade" and "call c2" in got.error, got
    # the same arguments journaled by this very version: the model's mistake, told to it
    assert isinstance(action(entries, code("v1", "lookup", "refund")), RunTools)


def test_arguments_no_version_could_read_are_told_to_the_model() -> None:
    entries = [turn(0, ("c1", "refund", {}))]
    entries[0]["calls"][0]["error"] = "arguments are not valid JSON"
    assert isinstance(action(entries, code("v2")), RunTools)


# The version.

@tool
async def lookup_order(ctx: ToolContext, order_id: str) -> dict:
    """Look an order up."""
    return {"order_id": order_id, "amount": 42.5}


@tool
async def notify(ctx: ToolContext, text: str) -> str:
    """Write to the customer."""
    SERVICE.apply("notify", ctx.key)
    return "sent"


@tool
async def apologize(ctx: ToolContext, text: str) -> str:
    """Say sorry (a tool v2 adds)."""
    SERVICE.apply("apologize", ctx.key)
    return "said"


@tool
async def refund(ctx: ToolContext, order_id: str, amount: float) -> dict:
    """Refund an order (moves money: idempotent by key)."""
    SERVICE.apply("refund", ctx.key)
    if SERVICE.crash_after_refund:
        SERVICE.crash_after_refund = False
        raise Crash("the worker dies after the refund took effect, before its result is journaled")
    return {"refunded": amount}


@tool(name="refund_money")
async def refund_money(ctx: ToolContext, order_id: str, amount: float) -> dict:
    """Refund an order (the same tool, renamed in v2)."""
    return await refund.fn(ctx, order_id, amount)


@tool(name="refund")
async def refund_cents(ctx: ToolContext, order_id: str, cents: int) -> dict:
    """Refund an order in cents (v2 changed the arguments)."""
    SERVICE.apply("refund", ctx.key)
    return {"refunded": cents}


INSTRUCTIONS = "Resolve the customer's issue."
V1 = Agent("support", INSTRUCTIONS, tools=[lookup_order, refund, notify])


def test_the_fingerprint_follows_what_the_model_is_shown_and_nothing_else() -> None:
    same = Agent("support", INSTRUCTIONS, tools=[notify, lookup_order, refund], max_turns=3, max_tool_calls=2)
    assert same.fingerprint == V1.fingerprint and len(V1.fingerprint) == 12, "order of tools and limits aside"
    changed = [
        Agent("support", INSTRUCTIONS + " Be brief.", tools=[lookup_order, refund, notify]),
        Agent("support", INSTRUCTIONS, tools=[lookup_order, refund, notify, apologize]),
        Agent("support", INSTRUCTIONS, tools=[lookup_order, refund_cents, notify]),
        Agent("support", INSTRUCTIONS, tools=[lookup_order, refund_money, notify], renamed={"refund": "refund_money"}),
        Agent("support", INSTRUCTIONS, tools=[lookup_order, refund, notify], output_model=type(
            "Out", (BaseModel,), {"__annotations__": {"done": bool}})),
    ]
    prints = {a.fingerprint for a in changed}
    assert len(prints) == len(changed) and V1.fingerprint not in prints
    labelled = Agent("support", INSTRUCTIONS, tools=[lookup_order, refund, notify], version="2")
    assert labelled.code_version == f"2+{V1.fingerprint}" and V1.code_version == V1.fingerprint


def test_the_fingerprint_is_the_same_in_every_worker_process() -> None:
    """Two workers of one build journal one version: a hash of canonical JSON, not Python's salted hash()."""
    from agents_stream.examples.support import SUPPORT
    script = "from agents_stream.examples.support import SUPPORT; print(SUPPORT.fingerprint)"
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed})
        assert out.stdout.strip() == SUPPORT.fingerprint


def test_a_rename_must_name_a_tool_the_agent_has_under_a_name_it_no_longer_uses() -> None:
    renamed = Agent("support", INSTRUCTIONS, tools=[refund_money], renamed={"refund": "refund_money"})
    assert renamed.by_name["refund"] is renamed.by_name["refund_money"]
    assert [t.name for t in renamed.tools] == ["refund_money"], "the model is offered the new name only"
    with pytest.raises(ValueError, match="renamed 'refund' → 'missing'"):
        Agent("support", INSTRUCTIONS, tools=[refund_money], renamed={"refund": "missing"})
    with pytest.raises(ValueError, match="renamed 'refund_money' → 'refund_money'"):
        Agent("support", INSTRUCTIONS, tools=[refund_money], renamed={"refund_money": "refund_money"})


# The loop on a journal a crash left behind, continued by new code.

class Crash(BaseException):
    """The worker dies here (SIGKILL): nothing catches it."""


@dataclass
class Service:
    """Applies each idempotency key once; counts every request."""

    effects: dict[str, str] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    crash_after_refund: bool = False

    def apply(self, operation: str, key: str) -> None:
        self.requests.append((operation, key))
        self.effects.setdefault(key, operation)


SERVICE = Service()
TASK = TaskPayload(task_id="t-1", agent_name="support", instruction="Refund order o-1")


@dataclass
class Model:
    """Look up → refund → notify → answer; records what each ask was shown."""

    refund_tool: str = "refund"
    asked: list[tuple[int, str, tuple[str, ...]]] = field(default_factory=list)

    async def __call__(self, conv: Conversation) -> TurnAnswer:
        n = sum(1 for m in conv.messages if isinstance(m, AssistantTurn))
        self.asked.append((n, conv.system, tuple(t.name for t in conv.tools)))
        calls = {0: (ToolCall(f"c{n}", "lookup_order", {"order_id": "o-1"}),),
                 1: (ToolCall(f"c{n}", self.refund_tool, {"order_id": "o-1", "amount": 42.5}),),
                 2: (ToolCall(f"c{n}", "notify", {"text": "refunded"}),)}.get(n, ())
        return TurnAnswer(Turn("" if calls else "refunded", calls, Usage(1, 1), "fake", "m"), "primary:fake:m",
                          "high", 1, None)


async def record_into(durable: list[Any], index: int, entry: dict[str, Any]) -> None:
    assert index == len(durable)
    durable.append(json.loads(json.dumps(entry)))


async def v1_crashed_mid_refund() -> list[Any]:
    """v1 ran turns 0 and 1; the refund took effect and the worker died before its result was journaled."""
    global SERVICE
    SERVICE = Service(crash_after_refund=True)
    durable: list[Any] = []
    loop = Loop(V1, TASK, [], ask=Model(), record=lambda i, e: record_into(durable, i, e))
    with pytest.raises(BaseExceptionGroup) as crashed:
        await loop.run()
    assert crashed.group_contains(Crash)
    assert [e["kind"] for e in durable] == ["turn", "tool", "turn"], "the refund's result is not journaled"
    assert SERVICE.effects == {"t-1:1:c1": "refund"}
    return durable


async def continue_with(agent: Agent, durable: list[Any], model: Model) -> Any:
    loop = Loop(agent, TASK, list(durable), ask=model, record=lambda i, e: record_into(durable, i, e))
    return await loop.run()


async def test_new_instructions_and_an_added_tool_continue_the_journal_with_each_effect_once() -> None:
    durable = await v1_crashed_mid_refund()
    v2 = Agent("support", "Resolve it, and apologise.", tools=[lookup_order, refund, notify, apologize], version="2")
    model = Model()
    end = await continue_with(v2, durable, model)
    assert isinstance(end, Done) and end.output == "refunded"
    assert SERVICE.requests[:2] == [("refund", "t-1:1:c1"), ("refund", "t-1:1:c1")], "the same key again"
    assert sorted(SERVICE.effects.values()) == ["notify", "refund"], "one refund, one notify"
    assert [n for n, _, _ in model.asked] == [2, 3], "turns 0 and 1 come from the journal"
    assert all(s == "Resolve it, and apologise." and "apologize" in tools for _, s, tools in model.asked), (
        "the model sees the new instructions and tools from the next turn on")
    versions = [t["version"] for t in transcript(durable)["turns"]]
    assert versions == [V1.code_version, V1.code_version, v2.code_version, v2.code_version]


async def test_a_removed_tool_ends_the_task_agent_upgrade_and_nothing_is_called_in_its_place() -> None:
    durable = await v1_crashed_mid_refund()
    v2 = Agent("support", INSTRUCTIONS, tools=[lookup_order, notify, apologize])
    model = Model()
    end = await continue_with(v2, durable, model)
    assert isinstance(end, Failed) and end.reason.startswith("agent_upgrade: the journal's next step (turn 1, call "
                                                              "c1) calls tool 'refund', which this version"), end
    assert f"journal version {V1.code_version}, code version {v2.code_version}" in end.error
    assert model.asked == [], "the model is not asked what to do instead"
    assert SERVICE.requests == [("refund", "t-1:1:c1")], "no tool ran after the upgrade"
    assert len(durable) == 3, "nothing journaled"


async def test_changed_arguments_end_the_task_rather_than_the_model_refunding_again_under_a_new_key() -> None:
    durable = await v1_crashed_mid_refund()
    v2 = Agent("support", INSTRUCTIONS, tools=[lookup_order, refund_cents, notify])
    model = Model()
    end = await continue_with(v2, durable, model)
    assert isinstance(end, Failed) and end.reason.startswith("agent_upgrade"), end
    assert "arguments this version refuses" in end.error and "cents" in end.error
    assert model.asked == [] and SERVICE.requests == [("refund", "t-1:1:c1")]


async def test_a_declared_rename_continues_the_old_call_under_its_first_key() -> None:
    durable = await v1_crashed_mid_refund()
    v2 = Agent("support", INSTRUCTIONS, tools=[lookup_order, refund_money, notify], renamed={"refund": "refund_money"})
    end = await continue_with(v2, durable, Model(refund_tool="refund_money"))
    assert isinstance(end, Done)
    assert [k for op, k in SERVICE.requests if op == "refund"] == ["t-1:1:c1", "t-1:1:c1"]
    assert list(SERVICE.effects.values()).count("refund") == 1
