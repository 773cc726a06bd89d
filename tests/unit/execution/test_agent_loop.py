"""The durable agent loop without I/O: a scripted model, tools on an idempotent in-memory service, crashes anywhere."""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from agents_stream.contract.errors import TransientError
from agents_stream.contract.models import TaskPayload
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.agent_loop import (
    Done,
    Failed,
    JournalBroken,
    Loop,
    LoopLimits,
    RunSignals,
    conversation,
    transcript,
)
from agents_stream.execution.outputs import OutputSpec
from agents_stream.execution.run import Rejected, TurnAnswer, Unavailable
from agents_stream.execution.tool_calls import ToolCalling
from agents_stream.execution.tools import FatalToolError, ToolContext, ToolError, tool
from agents_stream.ops.cli_views import render_transcript
from agents_stream.providers.base import Usage
from agents_stream.providers.conversation import AssistantTurn, Conversation, ToolCall, ToolResult, Turn, UserText


class Crash(BaseException):
    """The worker dies here (SIGKILL): nothing catches it, the loop ends without a word."""


@dataclass
class Service:
    """A payment-like service: applies each idempotency key once, counts every request."""

    effects: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)

    def apply(self, operation: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(key)
        self.effects.setdefault(key, (operation, body))
        return {"operation": operation, "id": f"{operation}-{sorted(self.effects).index(key)}"}


@dataclass
class World:
    """The service, the crash plan and what happened, shared by the tools and the model of one test."""

    service: Service = field(default_factory=Service)
    crash_at: set[int] = field(default_factory=set)  # crash opportunities (numbered as they come) that crash
    chances: int = 0
    asks: dict[int, int] = field(default_factory=dict)  # turn → times the model was asked for it

    def maybe_crash(self) -> None:
        self.chances += 1
        if self.chances in self.crash_at:
            raise Crash(f"crash at opportunity {self.chances}")


WORLD = World()


@tool
async def lookup_order(ctx: ToolContext, order_id: str) -> dict:
    """Look an order up."""
    await asyncio.sleep(0)
    return {"order_id": order_id, "amount": 42.5, "email": "a@example.com"}


@tool
async def refund(ctx: ToolContext, order_id: str, amount: float) -> dict:
    """Refund an order (moves money: idempotent by key)."""
    answer = WORLD.service.apply("refund", ctx.key, {"order_id": order_id, "amount": amount})
    WORLD.maybe_crash()  # the money left; the worker dies before the result is journaled
    return answer


@tool
def notify(ctx: ToolContext, email: str, text: str = "Your refund is on its way") -> str:
    """Write to the customer (a synchronous tool runs in a thread)."""
    WORLD.service.apply("notify", ctx.key, {"email": email, "text": text})
    return "sent"


SUPPORT = Agent("support", "Resolve the customer's issue.", tools=[lookup_order, refund, notify], max_turns=6)


def turns_in(conv: Conversation) -> int:
    return sum(1 for m in conv.messages if isinstance(m, AssistantTurn))


def results_in(conv: Conversation) -> dict[str, str]:
    return {m.name: m.content for m in conv.messages if isinstance(m, ToolResult)}


def support_model(conv: Conversation) -> Turn:
    """The scripted model: look up → refund the looked-up amount → notify → final answer. Fresh call ids every
    time it is asked, as a real model's."""
    n = turns_in(conv)
    ids = [f"c{random.getrandbits(32):08x}" for _ in range(2)]
    usage = Usage(10 * (n + 1), 5)
    if n == 0:
        calls = (ToolCall(ids[0], "lookup_order", {"order_id": "o-1"}),)
    elif n == 1:
        order = json.loads(results_in(conv)["lookup_order"])
        calls = (ToolCall(ids[0], "refund", {"order_id": order["order_id"], "amount": order["amount"]}),)
    elif n == 2:
        calls = (ToolCall(ids[0], "notify", {"email": "a@example.com"}),
                 ToolCall(ids[1], "lookup_order", {"order_id": "o-1"}))
    else:
        return Turn(f"refunded: {json.loads(results_in(conv)['refund'])['id']}", (), usage, "fake", "m")
    return Turn("", calls, usage, "fake", "m")


def make_ask(world: World, model: Any = support_model) -> Any:
    async def ask(conv: Conversation) -> TurnAnswer:
        n = turns_in(conv)
        world.asks[n] = world.asks.get(n, 0) + 1
        turn = model(conv)
        world.maybe_crash()  # the model answered; the worker dies before the turn is journaled
        return TurnAnswer(turn, "primary:fake:m", "high", 1, 0.001)
    return ask


def make_record(world: World, durable: list[Any]) -> Any:
    async def record(index: int, entry: dict[str, Any]) -> None:
        world.maybe_crash()  # dies before the entry is durable
        assert index == len(durable), "entries are journaled in order, one index each"
        durable.append(json.loads(json.dumps(entry)))  # what the changelog keeps: JSON
        world.maybe_crash()  # dies after it is durable, before the loop goes on
    return record


TASK = TaskPayload(task_id="t-1", agent_name="support", instruction="Refund order o-1")


async def run_to_end(world: World, agent: Agent = SUPPORT, max_restarts: int = 50, **kw: Any) -> tuple[Any, list]:
    """Run the loop; on a crash start a new one on what is durable (as a new worker would)."""
    durable: list[Any] = []
    for _ in range(max_restarts):
        loop = Loop(agent, TASK, list(durable), ask=make_ask(world, kw.get("model", support_model)),
                    record=make_record(world, durable), calling=ToolCalling(backoff_base_s=0.001, backoff_cap_s=0.002))
        try:
            return await loop.run(), durable
        except BaseException as exc:  # a crash, possibly inside the tools' task group
            crashes = exc.exceptions if isinstance(exc, BaseExceptionGroup) else [exc]
            # a sibling call that finishes after the crash meets the broken journal and stops too
            assert all(isinstance(c, Crash | JournalBroken) for c in crashes), crashes
            assert any(isinstance(c, Crash) for c in crashes), crashes
    raise AssertionError("too many restarts")


def shape(entries: list[Any]) -> list[Any]:
    """The conversation a journal stands for, without the call ids (a re-asked model picks new ones)."""
    conv = conversation(TASK, SUPPORT, "", entries)
    out: list[Any] = []
    for m in conv.messages:
        if isinstance(m, AssistantTurn):
            out.append(("assistant", m.text, [(c.name, c.arguments) for c in m.calls]))
        elif isinstance(m, ToolResult):
            out.append(("tool", m.name, m.content, m.error))
        else:
            out.append(("user", m.text))
    return out


async def test_a_crash_free_run_calls_the_tools_in_order_and_answers() -> None:
    global WORLD
    WORLD = World()
    end, journal_ = await run_to_end(WORLD)
    assert isinstance(end, Done) and end.output == "refunded: refund-0" and end.confidence == "high"
    ops = [op for op, _ in WORLD.service.effects.values()]
    assert sorted(ops) == ["notify", "refund"]
    assert WORLD.asks == {0: 1, 1: 1, 2: 1, 3: 1}
    summary = transcript(journal_)
    assert [t["tool_calls"] for t in summary["turns"]] == [["lookup_order"], ["refund"], ["notify", "lookup_order"], []]
    assert len(summary["tool_calls"]) == 4 and not any(c["error"] for c in summary["tool_calls"])
    key = next(k for k, (op, _) in WORLD.service.effects.items() if op == "refund")
    assert key.startswith("t-1:1:c"), "the key is <task_id>:<turn>:<call_id>"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sets(st.integers(min_value=1, max_value=40), max_size=6))
def test_crashes_anywhere_repeat_no_side_effect_and_end_as_a_crash_free_run(crash_at: set[int]) -> None:
    """Random crash points (after the model answered, after a refund took effect, before and after an entry is
    durable): every key has one effect, each operation ran under one key, a journaled turn is never asked again,
    and the final transcript is the crash-free one."""
    global WORLD
    WORLD = World()
    baseline, base_journal = asyncio.run(run_to_end(WORLD))
    WORLD = World(crash_at=set(crash_at))
    end, journal_ = asyncio.run(run_to_end(WORLD))
    assert end == baseline
    assert shape(journal_) == shape(base_journal)
    ops = sorted(op for op, _ in WORLD.service.effects.values())
    assert ops == ["notify", "refund"], f"one effect per operation, whatever crashed: {WORLD.service.effects}"
    refund_keys = {k for k in WORLD.service.requests if k in WORLD.service.effects
                   and WORLD.service.effects[k][0] == "refund"}
    assert len(refund_keys) == 1, "a repeated refund call carries the key of the first"
    crashes = len(crash_at & set(range(1, WORLD.chances + 1)))
    assert sum(WORLD.asks.values()) <= 4 + crashes, "only a turn lost in a crash is asked again"


async def test_a_resumed_loop_asks_no_journaled_turn_and_runs_no_journaled_call() -> None:
    global WORLD
    WORLD = World()
    _, journal_ = await run_to_end(WORLD)
    WORLD = World()
    durable = journal_[:4]  # turn 0, lookup, turn 1, the refund's result: the next action is turn 2
    loop = Loop(SUPPORT, TASK, list(durable), ask=make_ask(WORLD), record=make_record(WORLD, durable))
    end = await loop.run()
    assert isinstance(end, Done)
    assert set(WORLD.asks) == {2, 3}, "turns 0 and 1 come from the journal"
    assert [op for op, _ in WORLD.service.effects.values()] == ["notify"], "the journaled refund does not run again"


async def test_a_call_interrupted_mid_flight_runs_again_with_the_same_key() -> None:
    """A crash right after the refund took effect (before its result is journaled): the refund is requested
    again with the same key and has no second effect."""
    global WORLD
    WORLD = World()
    await run_to_end(WORLD)
    refund_key = next(k for k, (op, _) in WORLD.service.effects.items() if op == "refund")
    refund_chance = 1 + sum(1 for _ in WORLD.service.requests[: WORLD.service.requests.index(refund_key)])
    # the opportunities before the refund's: 3 per journaled entry and 1 per ask; count them on a spy run
    spy = World()
    seen: list[int] = []

    def count() -> None:
        spy.chances += 1
        if any(op == "refund" for op, _ in spy.service.effects.values()) and not seen:
            seen.append(spy.chances)
    spy.maybe_crash = count  # type: ignore[method-assign]
    WORLD = spy
    await run_to_end(spy)
    assert seen and refund_chance >= 1
    WORLD = World(crash_at={seen[0]})
    end, _ = await run_to_end(WORLD)
    assert isinstance(end, Done)
    refunds = [k for k in WORLD.service.requests if WORLD.service.effects.get(k, ("",))[0] == "refund"]
    assert len(refunds) == 2 and len(set(refunds)) == 1, f"asked twice, one key: {refunds}"


def scripted(*turns: Turn) -> Any:
    queue = list(turns)

    def model(conv: Conversation) -> Turn:
        return queue.pop(0)
    return model


def t(text: str = "", *calls: ToolCall) -> Turn:
    return Turn(text, calls, Usage(1, 1), "fake", "m")


async def test_tool_errors_and_invalid_arguments_go_back_to_the_model() -> None:
    global WORLD
    WORLD = World()
    model = scripted(
        t("", ToolCall("a", "refund", {"order_id": "o-1"}),  # amount missing
          ToolCall("b", "nope", {}), ToolCall("c", "refund", {}, error="arguments are not valid JSON: x")),
        t("gave up"),
    )
    end, journal_ = await run_to_end(WORLD, model=model)
    assert isinstance(end, Done) and end.output == "gave up"
    results = {e["id"]: e for e in journal_ if e["kind"] == "tool"}
    assert results["a"]["error"] and "amount" in results["a"]["content"] and "Field required" in results["a"]["content"]
    assert results["b"]["error"] and "no tool 'nope'" in results["b"]["content"]
    assert results["c"]["error"] and "not valid JSON" in results["c"]["content"]
    assert not WORLD.service.effects, "no call with bad arguments ran"


async def test_more_tool_errors_than_allowed_fail_the_task() -> None:
    agent = Agent("a", "x", tools=[refund], max_tool_errors=1)
    model = scripted(t("", ToolCall("a", "refund", {})), t("", ToolCall("b", "refund", {})), t("never"))
    end, _ = await run_to_end(World(), agent=agent, model=model)
    assert isinstance(end, Failed) and end.reason.startswith("tool_errors")


@tool(retries=2, timeout_s=5)
async def flaky(ctx: ToolContext) -> str:
    """Fails with a transient error on the first two attempts."""
    if ctx.attempt <= 2:
        raise TransientError("503 from the carrier")
    return f"ok after {ctx.attempt} with {ctx.key}"


@tool(retries=1)
async def down(ctx: ToolContext) -> str:
    """Always transiently down."""
    raise TransientError("connection refused")


@tool
async def broken(ctx: ToolContext) -> str:
    """Refuses, fatally."""
    raise FatalToolError("the account is closed")


@tool
async def complains(ctx: ToolContext) -> str:
    """Tells the model something went wrong."""
    raise ToolError("order o-9 does not exist")


async def test_transient_tool_errors_retry_with_one_key_and_then_tell_the_model() -> None:
    agent = Agent("a", "x", tools=[flaky, down, complains])
    model = scripted(t("", ToolCall("f", "flaky", {}), ToolCall("d", "down", {}), ToolCall("c", "complains", {})),
                     t("done"))
    end, journal_ = await run_to_end(World(), agent=agent, model=model)
    results = {e["id"]: e for e in journal_ if e["kind"] == "tool"}
    assert results["f"] == {**results["f"], "error": False, "attempts": 3, "content": "ok after 3 with t-1:0:f"}
    assert results["d"]["error"] and results["d"]["attempts"] == 2 and "unavailable" in results["d"]["content"]
    assert results["c"]["error"] and results["c"]["content"] == "order o-9 does not exist"
    assert isinstance(end, Done)


async def test_a_fatal_tool_error_ends_the_task_without_another_turn() -> None:
    world = World()
    agent = Agent("a", "x", tools=[broken])
    end, _ = await run_to_end(world, agent=agent, model=scripted(t("", ToolCall("x", "broken", {}))))
    assert isinstance(end, Failed) and end.reason.startswith("tool_failed") and "account is closed" in end.error
    assert world.asks == {0: 1}


async def test_max_turns_and_max_tool_calls_end_the_loop() -> None:
    endless = Agent("a", "x", tools=[lookup_order], max_turns=3)

    def model(conv: Conversation) -> Turn:
        return t("", ToolCall(f"c{turns_in(conv)}", "lookup_order", {"order_id": "o"}))
    end, _ = await run_to_end(World(), agent=endless, model=model)
    assert isinstance(end, Failed) and end.reason.startswith("max_turns")
    greedy = Agent("a", "x", tools=[lookup_order], max_tool_calls=2)
    many = tuple(ToolCall(f"c{i}", "lookup_order", {"order_id": "o"}) for i in range(3))
    end, journal_ = await run_to_end(World(), agent=greedy, model=scripted(t("", *many)))
    assert isinstance(end, Failed) and end.reason.startswith("max_tool_calls")
    assert not [e for e in journal_ if e["kind"] == "tool"], "no call of a turn over the limit runs"


@tool
async def huge(ctx: ToolContext) -> str:
    """Returns 2 MB."""
    return "x" * 2_000_000


async def test_a_huge_tool_result_fails_the_task_or_is_truncated_as_configured() -> None:
    failing = Agent("a", "x", tools=[huge])
    end, journal_ = await run_to_end(World(), agent=failing, model=scripted(t("", ToolCall("h", "huge", {}))))
    assert isinstance(end, Failed) and end.reason.startswith("journal_too_large")
    assert [e["kind"] for e in journal_] == ["turn"], "the result that does not fit is not journaled"
    cutting = Agent("a", "x", tools=[huge], on_large_result="truncate", tool_result_max_bytes=1000)
    end, journal_ = await run_to_end(World(), agent=cutting,
                                     model=scripted(t("", ToolCall("h", "huge", {})), t("fine")))
    assert isinstance(end, Done)
    kept = next(e for e in journal_ if e["kind"] == "tool")["content"]
    assert kept.startswith("x" * 1000) and kept.endswith("[truncated: 1000 of 2000000 bytes kept]")


async def test_a_journal_that_would_not_fit_the_record_ends_the_task() -> None:
    durable: list[Any] = []
    sizes: list[int] = []

    def fits(size: int) -> bool:  # the record holds two entries
        sizes.append(size)
        return len(sizes) < 3

    loop = Loop(SUPPORT, TASK, [], ask=make_ask(World()), record=make_record(World(), durable),
                limits=LoopLimits(journal_fits=fits))
    end = await loop.run()
    assert isinstance(end, Failed) and end.reason.startswith("journal_too_large") and len(durable) == 2
    assert sizes[:2] == [len(json.dumps(durable[:n], separators=(",", ":"))) for n in (1, 2)], (
        "the size asked about is the journal's JSON with the new entry")


class Refund(BaseModel):
    refunded: bool
    amount: float


async def test_an_off_format_final_answer_is_corrected_within_format_retries() -> None:
    agent = Agent("a", "x", output_model=Refund, format_retries=1)
    spec = OutputSpec.from_model(Refund)
    good = scripted(t("refunded it"), t('{"refunded": true, "amount": 42.5}'))
    durable: list[Any] = []
    loop = Loop(agent, TASK, durable, ask=make_ask(World(), good), record=make_record(World(), []), spec=spec)
    end = await loop.run()
    assert end == Done({"refunded": True, "amount": 42.5}, "high", "primary:fake:m")
    notes = [e for e in durable if e["kind"] == "note"]
    assert len(notes) == 1 and "rejected" in notes[0]["text"]
    assert isinstance(conversation(TASK, agent, "", durable).messages[2], UserText), "the model is told why"
    bad = scripted(t("no"), t("still no"))
    loop = Loop(agent, TASK, [], ask=make_ask(World(), bad), record=make_record(World(), []), spec=spec)
    end = await loop.run()
    assert isinstance(end, Failed) and end.reason.startswith("invalid_output")


async def test_no_model_available_returns_unavailable_and_a_rejection_fails() -> None:
    async def down_ask(conv: Conversation) -> Unavailable:
        return Unavailable(123.0, "circuit open")
    loop = Loop(SUPPORT, TASK, [], ask=down_ask, record=make_record(World(), []))
    assert await loop.run() == Unavailable(123.0, "circuit open")

    async def refused(conv: Conversation) -> Rejected:
        return Rejected("permanent_error: 400", "bad request", "primary:x")
    loop = Loop(SUPPORT, TASK, [], ask=refused, record=make_record(World(), []))
    assert await loop.run() == Failed("permanent_error: 400", "bad request", "primary:x")


async def test_the_calls_of_one_turn_run_concurrently_each_journaled_on_its_own() -> None:
    started: list[str] = []
    gate = asyncio.Event()

    @tool
    async def slow(ctx: ToolContext, name: str) -> str:
        """Waits until both calls have started."""
        started.append(name)
        if len(started) == 2:
            gate.set()
        await asyncio.wait_for(gate.wait(), 2)
        return name

    agent = Agent("a", "x", tools=[slow])
    model = scripted(t("", ToolCall("1", "slow", {"name": "one"}), ToolCall("2", "slow", {"name": "two"})), t("ok"))
    end, journal_ = await run_to_end(World(), agent=agent, model=model)
    assert isinstance(end, Done) and sorted(started) == ["one", "two"]
    assert sorted(e["id"] for e in journal_ if e["kind"] == "tool") == ["1", "2"]


def test_the_conversation_keeps_the_models_order_whatever_order_the_calls_finished_in() -> None:
    entries = [
        {"kind": "turn", "turn": 0, "text": "", "calls": [{"id": "a", "name": "x", "arguments": {}},
                                                          {"id": "b", "name": "y", "arguments": {}}],
         "source": "s", "confidence": "high", "provider_calls": 1, "usage": {}},
        {"kind": "tool", "turn": 0, "id": "b", "name": "y", "content": "B", "error": False, "fatal": False,
         "attempts": 1},
        {"kind": "tool", "turn": 0, "id": "a", "name": "x", "content": "A", "error": False, "fatal": False,
         "attempts": 1},
    ]
    conv = conversation(TASK, SUPPORT, "sys", entries)
    assert [type(m).__name__ for m in conv.messages] == ["UserText", "AssistantTurn", "ToolResult", "ToolResult"]
    assert [m.call_id for m in conv.messages if isinstance(m, ToolResult)] == ["a", "b"]
    assert conv.messages[0].text.startswith("[task_id=t-1]\n")  # type: ignore[union-attr]
    assert {s.name for s in conv.tools} == {"lookup_order", "refund", "notify"}


@pytest.mark.parametrize("dup", [True, False])
async def test_calls_without_or_with_repeated_ids_get_ids_of_their_own(dup: bool) -> None:
    calls = (ToolCall("same" if dup else "", "lookup_order", {"order_id": "1"}),
             ToolCall("same" if dup else "", "lookup_order", {"order_id": "2"}))
    end, journal_ = await run_to_end(World(), model=scripted(t("", *calls), t("ok")))
    ids = [c["id"] for c in journal_[0]["calls"]]
    assert len(set(ids)) == 2 and ids == (["same", "same_"] if dup else ["call_0_0", "call_0_1"])
    assert isinstance(end, Done)


async def test_a_task_past_its_token_or_cost_budget_fails_before_the_next_turn() -> None:
    """The scripted model uses 15, 25, 35 tokens on its turns (0.001 USD each): a budget of 40 tokens stops the loop
    after two turns, one of 0.002 USD after two as well; nothing is asked past the budget."""
    for agent in (Agent("a", "x", tools=SUPPORT.tools, max_tokens=40), Agent("a", "x", tools=SUPPORT.tools,
                                                                              max_cost_usd=0.002)):
        world = World()
        global WORLD
        WORLD = world
        end, journal_ = await run_to_end(world, agent=agent)
        assert isinstance(end, Failed) and end.reason.startswith("budget_exceeded"), end
        assert world.asks == {0: 1, 1: 1}, "no turn is asked past the budget"


async def test_the_transcript_renders_as_a_timeline_for_tasks_show() -> None:
    global WORLD
    WORLD = World()
    _, journal_ = await run_to_end(WORLD)
    lines = render_transcript(transcript(journal_))
    assert lines[0] == "timeline:" and len(lines) == 1 + 4 + 4
    assert lines[1].startswith("  turn 0   primary:fake:m  10 in / 5 out  0.001000 USD  → lookup_order")
    assert lines[2].startswith("    lookup_order (c") and lines[2].endswith("ok  1 attempt")
    assert lines[-1].endswith("→ final answer")


@tool
async def weather(ctx: ToolContext, city: str) -> str:
    """The weather in a city; a city it does not know is the model's mistake (issue 29 item 4)."""
    raise ToolError(f"unknown city {city!r} (asked with key sk-live-0123456789abcdef)")


async def test_a_failed_tool_calls_text_is_in_the_transcript_the_event_the_log_and_tasks_show(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ToolError's text and a wrong argument name's validation error reach the transcript (tasks show, the task
    view), the agent.tool_call event and a log line: bounded, with the worker's secrets redacted."""
    monkeypatch.setenv("WEATHER_API_KEY", "sk-live-0123456789abcdef")
    agent = Agent("a", "x", tools=[weather])
    model = scripted(t("", ToolCall("w", "weather", {"city": "Atlantis"}), ToolCall("v", "weather", {"town": "Oslo"})),
                     t("I could not tell"))
    durable: list[Any] = []
    events: list[tuple[str, dict[str, Any]]] = []
    loop = Loop(agent, TASK, [], ask=make_ask(World(), model), record=make_record(World(), durable),
                signals=RunSignals(on_event=lambda event, details: events.append((event, details))))
    with caplog.at_level("INFO", logger="agents_stream.execution.agent_loop"):
        end = await loop.run()
    assert isinstance(end, Done)
    calls = {c["id"]: c for c in transcript(durable)["tool_calls"]}
    assert calls["w"]["detail"] == "unknown city 'Atlantis' (asked with key <redacted>)"
    assert calls["v"]["detail"].startswith("invalid arguments for weather: ")
    assert "city: Field required" in calls["v"]["detail"] and "town" in calls["v"]["detail"]
    sent = {d["call_id"]: d for e, d in events if e == "agent.tool_call"}
    assert sent["w"]["detail"] == calls["w"]["detail"] and sent["v"]["detail"] == calls["v"]["detail"]
    logged = [r.getMessage() for r in caplog.records if "tool weather" in r.getMessage()]
    assert any("unknown city 'Atlantis'" in m and "<redacted>" in m for m in logged), logged
    assert not any("sk-live" in m for m in logged)
    shown = "\n".join(render_transcript(transcript(durable)))
    assert "weather (w)  error  1 attempt: unknown city 'Atlantis'" in shown
    assert "weather (v)  error  0 attempts: invalid arguments for weather: " in shown


def test_a_tool_errors_detail_is_bounded() -> None:
    from agents_stream.execution.tools import ERROR_DETAIL_MAX_CHARS, error_detail

    assert len(error_detail("x" * 10_000, {})) == ERROR_DETAIL_MAX_CHARS
    assert error_detail("token abcdefgh1234 and pw", {"MY_TOKEN": "abcdefgh1234", "SHORT_KEY": "pw"}) == \
        "token <redacted> and pw"


class HeldRecord:
    """A journal whose tool-result records are confirmed only when the test says (``confirm``) or fail (``fail``)."""

    def __init__(self) -> None:
        self.durable: list[Any] = []
        self.log: list[str] = []
        self.released = asyncio.Event()
        self.error: BaseException | None = None

    async def __call__(self, index: int, entry: dict[str, Any]) -> None:
        if entry["kind"] == "tool":
            self.log.append(f"result {index} sent")
            await self.released.wait()
            if self.error is not None:
                raise self.error
        self.durable.append(entry)
        self.log.append(f"{entry['kind']} {index} durable")

    def asking(self, base: Any) -> Any:
        """``base``, the model, with each turn it is asked written to the log."""
        async def ask(conv: Conversation) -> TurnAnswer | Unavailable | Rejected:
            self.log.append(f"asked turn {turns_in(conv)}")
            return await base(conv)
        return ask

    async def logged(self, line: str) -> None:
        """Return once ``line`` is in the log (10 s at most)."""
        for _ in range(1000):
            if line in self.log:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{line!r} never logged: {self.log}")


async def test_the_next_turn_is_asked_while_a_tool_results_record_is_on_its_way_and_journaled_after_it() -> None:
    """A tool result's record is not awaited by the next model call, only by the next entry: the model is asked turn
    1 first, the result's record starts once the call's request is out, and turn 1 is journaled after the result is
    durable."""
    held = HeldRecord()
    base = make_ask(World(), scripted(t("", ToolCall("c1", "lookup_order", {"order_id": "o-1"})), t("done")))

    async def ask(conv: Conversation) -> TurnAnswer | Unavailable | Rejected:
        held.log.append(f"asked turn {turns_in(conv)}")
        if turns_in(conv) == 1:
            held.released.set()  # the result's record is confirmed only now, while the model is being asked
        return await base(conv)

    loop = Loop(Agent("a", "x", tools=[lookup_order]), TASK, [], ask=ask, record=held)
    end = await asyncio.wait_for(loop.run(), 10)  # a loop that awaited the result before asking would wait forever
    assert isinstance(end, Done) and end.output == "done"
    assert held.log == ["asked turn 0", "turn 0 durable", "asked turn 1", "result 1 sent", "tool 1 durable",
                        "turn 2 durable"]


async def test_a_tool_results_record_that_fails_stops_the_loop_before_the_next_turn_is_journaled() -> None:
    held = HeldRecord()
    held.error = RuntimeError("the broker refused the record")
    base = make_ask(World(), scripted(t("", ToolCall("c1", "lookup_order", {"order_id": "o-1"})), t("done")))

    async def ask(conv: Conversation) -> TurnAnswer | Unavailable | Rejected:
        held.released.set()
        return await base(conv)

    loop = Loop(Agent("a", "x", tools=[lookup_order]), TASK, [], ask=ask, record=held)
    with pytest.raises(RuntimeError, match="refused"):
        await loop.run()
    assert [e["kind"] for e in held.durable] == ["turn"], "nothing after the failed result is journaled"


async def test_a_result_that_finishes_while_a_slower_call_of_its_turn_runs_is_recorded_at_once() -> None:
    """Two calls in one turn: the quick one's record starts as it finishes, not once the slow one is done (a crash
    during the slow call must not lose the quick one's result); the turn's last result waits for the next call."""
    held = HeldRecord()
    held.released.set()
    slow_may_end = asyncio.Event()

    @tool
    async def slow(ctx: ToolContext) -> str:
        """Take a while."""
        await slow_may_end.wait()
        held.log.append("slow ended")
        return "slow done"

    ask = held.asking(make_ask(World(), scripted(
        t("", ToolCall("q", "lookup_order", {"order_id": "o-1"}), ToolCall("s", "slow", {})), t("done"))))

    async def end_slow_once_quick_is_recorded() -> None:
        await held.logged("tool 1 durable")
        slow_may_end.set()

    ender = asyncio.ensure_future(end_slow_once_quick_is_recorded())
    loop = Loop(Agent("a", "x", tools=[lookup_order, slow]), TASK, [], ask=ask, record=held)
    end = await asyncio.wait_for(loop.run(), 10)
    await ender
    assert isinstance(end, Done)
    assert held.log == ["asked turn 0", "turn 0 durable", "result 1 sent", "tool 1 durable", "slow ended",
                        "asked turn 1", "result 2 sent", "tool 2 durable", "turn 3 durable"]


async def test_a_tool_results_record_goes_out_even_when_the_next_model_call_fails() -> None:
    """The result's record starts once the next call's request is out; a call that raises still leaves it sent (a
    resumed run finds the result journaled instead of calling the tool again)."""
    held = HeldRecord()
    held.released.set()
    base = make_ask(World(), scripted(t("", ToolCall("c1", "lookup_order", {"order_id": "o-1"})), t("done")))

    async def ask(conv: Conversation) -> TurnAnswer | Unavailable | Rejected:
        if turns_in(conv) == 1:
            raise RuntimeError("the model's connection broke")
        return await base(conv)

    loop = Loop(Agent("a", "x", tools=[lookup_order]), TASK, [], ask=ask, record=held)
    with pytest.raises(RuntimeError, match="connection broke"):
        await loop.run()
    for _ in range(100):  # not awaited by the run that failed: it settles on its own
        if len(held.durable) == 2:
            break
        await asyncio.sleep(0.01)
    assert [e["kind"] for e in held.durable] == ["turn", "tool"]


async def test_a_run_cancelled_as_it_asks_cancels_the_model_call_too() -> None:
    held = HeldRecord()
    held.released.set()
    base = make_ask(World(), scripted(t("", ToolCall("c1", "lookup_order", {"order_id": "o-1"})), t("done")))
    asked = asyncio.Event()
    call_cancelled = asyncio.Event()

    async def ask(conv: Conversation) -> TurnAnswer | Unavailable | Rejected:
        if turns_in(conv) == 1:
            asked.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                call_cancelled.set()
                raise
        return await base(conv)

    loop = Loop(Agent("a", "x", tools=[lookup_order]), TASK, [], ask=ask, record=held)
    run = asyncio.ensure_future(loop.run())
    await asyncio.wait_for(asked.wait(), 5)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await asyncio.wait_for(call_cancelled.wait(), 5)


async def test_a_worker_the_group_has_not_confirmed_lately_waits_for_its_tool_results_record_before_asking() -> None:
    """Cut off from the brokers, a worker may have lost the task: its tool result's record (which then goes to the
    partition's owner, and fences the run) is awaited before the next model call, which would be wasted."""
    held = HeldRecord()
    ask = held.asking(make_ask(World(), scripted(t("", ToolCall("c1", "lookup_order", {"order_id": "o-1"})),
                                                 t("done"))))

    async def release_soon() -> None:
        await held.logged("result 1 sent")
        held.log.append("confirmed")
        held.released.set()

    loop = Loop(Agent("a", "x", tools=[lookup_order]), TASK, [], ask=ask, record=held,
                signals=RunSignals(confirmed_member=lambda: False))
    releaser = asyncio.ensure_future(release_soon())
    end = await asyncio.wait_for(loop.run(), 10)
    await releaser
    assert isinstance(end, Done)
    assert held.log == ["asked turn 0", "turn 0 durable", "result 1 sent", "confirmed", "tool 1 durable",
                        "asked turn 1", "turn 2 durable"]


async def test_the_final_answers_entry_is_left_for_the_final_outcome_when_the_caller_sends_it_so() -> None:
    """With ``final_with_outcome`` the final answer's entry joins the journal unrecorded (``final_entry``): the
    executor sends it with the final outcome, one write. Every other entry is recorded as before."""
    held = HeldRecord()
    held.released.set()
    ask = make_ask(World(), scripted(t("", ToolCall("c1", "lookup_order", {"order_id": "o-1"})), t("done")))
    entries: list[Any] = []
    loop = Loop(Agent("a", "x", tools=[lookup_order]), TASK, entries, ask=ask, record=held,
                signals=RunSignals(final_with_outcome=True))
    end = await asyncio.wait_for(loop.run(), 10)
    assert isinstance(end, Done) and end.output == "done"
    assert [e["kind"] for e in held.durable] == ["turn", "tool"], "the final turn is not recorded by the loop"
    assert loop.final_entry == (2, entries[2]) and entries[2]["kind"] == "turn" and entries[2]["text"] == "done"


async def test_a_held_final_answer_is_recorded_before_anything_journaled_after_it_and_on_any_other_end() -> None:
    """The held final answer is a journal entry like any other once the loop goes on: an answer the output spec
    rejects is recorded before its correction note; unconfirmed, the worker records it at once."""
    agent = Agent("a", "x", output_model=Refund, format_retries=1)
    indexes: list[tuple[int, str]] = []

    async def record(index: int, entry: dict[str, Any]) -> None:
        indexes.append((index, entry["kind"]))

    good = scripted(t("refunded it"), t('{"refunded": true, "amount": 42.5}'))
    loop = Loop(agent, TASK, [], ask=make_ask(World(), good), record=record, spec=OutputSpec.from_model(Refund),
                signals=RunSignals(final_with_outcome=True))
    assert isinstance(await loop.run(), Done)
    assert indexes == [(0, "turn"), (1, "note")] and loop.final_entry is not None and loop.final_entry[0] == 2
    indexes.clear()
    bad = scripted(t("no"), t("still no"))
    loop = Loop(agent, TASK, [], ask=make_ask(World(), bad), record=record, spec=OutputSpec.from_model(Refund),
                signals=RunSignals(final_with_outcome=True))
    assert isinstance(await loop.run(), Failed)
    assert indexes == [(0, "turn"), (1, "note"), (2, "turn"), (3, "note")] and loop.final_entry is None
    indexes.clear()
    loop = Loop(SUPPORT, TASK, [], ask=make_ask(World(), scripted(t("done"))), record=record,
                signals=RunSignals(final_with_outcome=True, confirmed_member=lambda: False))
    assert isinstance(await loop.run(), Done)
    assert indexes == [(0, "turn")] and loop.final_entry is None, "a worker not confirmed lately records it itself"
