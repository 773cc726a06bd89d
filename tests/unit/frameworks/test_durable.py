"""Replay by position (agents_stream/frameworks/durable.py), without I/O: a framework agent's model requests and tool
calls over a journal, as a crash and a second dispatch see it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agents_stream.contract.errors import Fenced
from agents_stream.execution.agent_loop import transcript
from agents_stream.frameworks import call_context, idempotency_headers, idempotency_key
from agents_stream.frameworks.durable import (
    DurableRun,
    JournalBroken,
    JournalMismatch,
    JournalTooLarge,
    ModelTurn,
    ToolOutcome,
)


class Journal:
    """The task's record as the ledger keeps it: entries appended once "confirmed"; every write and check counted."""

    def __init__(self) -> None:
        self.entries: list[Any] = []
        self.recorded: list[tuple[int, dict[str, Any]]] = []
        self.checks = 0
        self.fenced = False
        self.fail_writes = False

    def run(self, **kw: Any) -> DurableRun:
        async def record(index: int, entry: dict[str, Any]) -> None:
            if self.fail_writes:
                raise ConnectionError("the broker did not answer")
            self.recorded.append((index, entry))

        async def check() -> None:
            self.checks += 1
            if self.fenced:
                raise Fenced("this worker left the group")

        # each dispatch starts from what the record holds (the ledger's copy), not the previous run's list
        return DurableRun(task_id="t1", framework="fw", version="v1", entries=self.entries, record=record,
                          check=check, fencing_token=kw.pop("fencing_token", 3), **kw)


class Model:
    """A scripted model: each request answers the next response; counts the requests it got."""

    def __init__(self, *responses: ModelTurn) -> None:
        self.responses = list(responses)
        self.asked = 0

    async def __call__(self) -> ModelTurn:
        self.asked += 1
        return self.responses.pop(0)


def calls(*pairs: tuple[str, str]) -> ModelTurn:
    made = tuple({"id": i, "name": n, "arguments": {"order": "o1"}} for i, n in pairs)
    return ModelTurn(response={"calls": [list(p) for p in pairs]}, calls=made, source="fw:m", input_tokens=5,
                     output_tokens=2)


def final(text: str) -> ModelTurn:
    return ModelTurn(response={"text": text}, text=text, source="fw:m", input_tokens=7, output_tokens=3)


class Service:
    """A side-effecting service, idempotent by key: counts effects (first calls of a key) and every call."""

    def __init__(self) -> None:
        self.effects: list[str] = []
        self.calls: list[str] = []

    async def refund(self) -> ToolOutcome:
        key = idempotency_key()
        self.calls.append(key)
        if key not in self.effects:
            self.effects.append(key)
        return ToolOutcome({"refunded": 42.5, "key": key})


async def agent(run: DurableRun, model: Model, service: Service, *, crash_after_refund: bool = False) -> Any:
    """A framework's loop as an adapter drives it: ask, run the asked tools, ask again until a final answer."""
    while True:
        response = await run.model_request(model, asked=f"request {run.requests}")
        if "text" in response:
            return response["text"]
        for call_id, name in response["calls"]:
            await run.tool_call(call_id, name, {"order": "o1"}, service.refund)
            if crash_after_refund:
                raise SystemExit("SIGKILL")


async def test_a_run_started_again_asks_no_journaled_request_and_runs_no_journaled_call() -> None:
    journal, service = Journal(), Service()
    first = Model(calls(("c1", "refund")))
    with pytest.raises(SystemExit):
        await agent(journal.run(), first, service, crash_after_refund=True)
    assert [e["kind"] for e in journal.entries] == ["turn", "tool"], "the turn and the refund were journaled"
    assert first.asked == 1 and service.effects == ["t1:0:c1"]

    second = Model(final("Refunded."))
    run = journal.run()
    assert await agent(run, second, service) == "Refunded."
    assert second.asked == 1, "only the request never journaled is asked"
    assert service.calls == ["t1:0:c1"], "the journaled refund does not run again"
    assert (run.replayed_turns, run.asked_turns, run.replayed_calls, run.ran_calls) == (1, 1, 1, 0)
    assert [i for i, _ in journal.recorded] == [0, 1, 2], "each entry has the next index"
    seen = transcript(journal.entries)
    assert [t["tool_calls"] for t in seen["turns"]] == [["refund"], []]
    assert [c["name"] for c in seen["tool_calls"]] == ["refund"]


async def test_a_replayed_answer_is_the_journaled_one_and_a_tool_result_keeps_its_json() -> None:
    journal, service = Journal(), Service()
    run = journal.run()
    assert await run.model_request(Model(calls(("c1", "refund")))) == {"calls": [["c1", "refund"]]}
    assert await run.tool_call("c1", "refund", {}, service.refund) == {"refunded": 42.5, "key": "t1:0:c1"}
    again = journal.run()
    assert await again.model_request(Model()) == {"calls": [["c1", "refund"]]}
    assert await again.tool_call("c1", "refund", {}, service.refund) == {"refunded": 42.5, "key": "t1:0:c1"}
    tool = journal.entries[1]
    assert tool["content"] == '{"refunded":42.5,"key":"t1:0:c1"}' and tool["framework"] == "fw"


async def test_a_tool_cut_by_a_crash_runs_again_under_the_same_key() -> None:
    journal, service = Journal(), Service()
    run = journal.run()
    await run.model_request(Model(calls(("c1", "refund"))))
    journal.fail_writes = True
    with pytest.raises(ConnectionError):
        await run.tool_call("c1", "refund", {}, service.refund)
    journal.fail_writes = False
    with pytest.raises(JournalBroken):  # whether the failed write landed is unknown: this run stops
        await run.tool_call("c1", "refund", {}, service.refund)
    again = journal.run()
    await again.model_request(Model())
    await again.tool_call("c1", "refund", {}, service.refund)
    assert service.calls == ["t1:0:c1", "t1:0:c1"] and service.effects == ["t1:0:c1"]


async def test_parallel_calls_are_journaled_by_call_id_not_by_the_order_they_finish() -> None:
    journal = Journal()
    run = journal.run()
    await run.model_request(Model(calls(("a", "slow"), ("b", "fast"))))
    ran: list[str] = []

    async def tool(name: str, wait: float) -> ToolOutcome:
        await asyncio.sleep(wait)
        ran.append(name)
        return ToolOutcome(f"{name} done by {idempotency_key()}")

    results = await asyncio.gather(run.tool_call("a", "slow", {}, lambda: tool("slow", 0.05)),
                                   run.tool_call("b", "fast", {}, lambda: tool("fast", 0)))
    assert ran == ["fast", "slow"] and results == ["slow done by t1:0:a", "fast done by t1:0:b"]
    again = journal.run()
    await again.model_request(Model())
    replayed = await asyncio.gather(again.tool_call("a", "slow", {}, lambda: tool("x", 0)),
                                    again.tool_call("b", "fast", {}, lambda: tool("x", 0)))
    assert replayed == results and ran == ["fast", "slow"]


async def test_a_journal_that_does_not_fit_what_the_agent_asks_ends_the_task() -> None:
    journal, service = Journal(), Service()
    run = journal.run()
    await run.model_request(Model(calls(("c1", "refund"))), asked="tools=refund")
    again = journal.run()
    await again.model_request(Model())
    with pytest.raises(JournalMismatch, match="calls tool 'charge' as call c1 of turn 0.*a call of 'refund'"):
        await again.tool_call("c1", "charge", {}, service.refund)
    with pytest.raises(JournalMismatch, match="no such call"):
        await again.tool_call("c9", "refund", {}, service.refund)
    with pytest.raises(JournalMismatch, match="another shape"):
        await journal.run().model_request(Model(), asked="tools=charge")
    other = DurableRun(task_id="t1", framework="other", version="v", entries=journal.entries,
                       record=journal.run().record, check=journal.run().check)
    with pytest.raises(JournalMismatch, match="written by fw, and this agent runs on other"):
        await other.model_request(Model())
    built_in = Journal()
    built_in.entries.append({"kind": "turn", "turn": 0, "text": "", "calls": [], "source": "primary",
                             "confidence": "high", "usage": {}, "provider_calls": 1})
    with pytest.raises(JournalMismatch, match="the built-in agent loop"):
        await built_in.run().model_request(Model())
    assert service.calls == [], "nothing ran in place of the journaled call"


async def test_a_fenced_run_asks_no_model_and_runs_no_tool_but_still_replays() -> None:
    journal, service = Journal(), Service()
    run = journal.run()
    await run.model_request(Model(calls(("c1", "refund"))))
    journal.fenced = True
    model = Model(final("x"))
    again = journal.run()
    await again.model_request(model)  # journaled: no check needed, nothing is asked
    with pytest.raises(Fenced):
        await again.tool_call("c1", "refund", {}, service.refund)
    with pytest.raises(Fenced):
        await again.model_request(model)  # the next request, never journaled
    assert service.calls == [] and model.asked == 0


async def test_the_key_and_fencing_headers_are_known_only_inside_a_call() -> None:
    journal = Journal()
    run = journal.run(fencing_token=7)
    await run.model_request(Model(calls(("c1", "refund"))))
    seen: list[Any] = []

    async def tool() -> ToolOutcome:
        seen.append((call_context(), idempotency_headers()))
        return ToolOutcome("ok")

    await run.tool_call("c1", "refund", {}, tool)
    ctx, headers = seen[0]
    assert (ctx.turn, ctx.call_id, ctx.fencing_token) == (0, "c1", 7)
    assert headers == {"Idempotency-Key": "t1:0:c1", "Fencing-Resource": "t1", "Fencing-Token": "7"}
    with pytest.raises(RuntimeError, match="only inside a tool"):
        idempotency_key()


async def test_an_entry_the_record_cannot_hold_ends_the_task_before_it_is_written() -> None:
    journal = Journal()
    run = journal.run(fits=lambda size: size < 600)
    await run.model_request(Model(calls(("c1", "refund"))))
    with pytest.raises(JournalTooLarge, match="journal_too_large"):
        await run.tool_call("c1", "refund", {}, lambda: _big())
    assert len(journal.entries) == 1


async def _big() -> ToolOutcome:
    return ToolOutcome("x" * 500)


NOT_AN_AGENT = object()


def test_the_config_names_an_agent_or_a_framework_agent_and_anything_else_is_said_plainly() -> None:
    from agents_stream.execution.agent_definitions import Agent
    from agents_stream.frameworks import load_acting

    assert isinstance(load_acting("agents_stream.examples.support:SUPPORT"), Agent)
    with pytest.raises(ValueError, match="is not an agents_stream Agent, a pydantic_ai Agent or an OpenAI Agents SDK "
                                         r"agents.Agent \(it is a builtins.object\)"):
        load_acting("tests.unit.frameworks.test_durable:NOT_AN_AGENT")
