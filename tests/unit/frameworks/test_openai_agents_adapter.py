"""The OpenAI Agents SDK adapter without I/O: an unchanged ``agents.Agent`` whose model is scripted (the SDK's own
``Model`` interface) run over a journal, as a crash and a second dispatch see it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2
import openai
import pytest
from agents import Agent, FunctionTool, LocalShellTool, ModelResponse, function_tool
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
from pydantic import BaseModel

from agents_stream.contract.errors import Fenced
from agents_stream.examples.openai_agents_support import MODEL, SUPPORT
from agents_stream.execution.agent_loop import transcript
from agents_stream.frameworks import call_context, load_acting
from agents_stream.frameworks.durable import DurableRun, JournalMismatch
from agents_stream.frameworks.openai_agents_adapter import FRAMEWORK, OpenAIAgentsAgent, adapt
from agents_stream.frameworks.runner import stopping

PROMPT = "[task_id=t1]\nRefund order o1."


def calls(*made: tuple[str, str, dict[str, Any]]) -> ModelResponse:
    """A response asking for tool calls: (call id, tool, arguments) each."""
    return ModelResponse(
        output=[ResponseFunctionToolCall(arguments=json.dumps(a), call_id=i, name=n, type="function_call",
                                         id="__fake_id__") for i, n, a in made],
        usage=Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15), response_id=None)


def text(answer: str) -> ModelResponse:
    return ModelResponse(
        output=[ResponseOutputMessage(id="__fake_id__", role="assistant", status="completed", type="message",
                                      content=[ResponseOutputText(text=answer, type="output_text", annotations=[])])],
        usage=Usage(requests=1, input_tokens=20, output_tokens=7, total_tokens=27), response_id=None)


class Scripted(Model):
    """The SDK's model interface, answering a script; counts the requests it got and the tools each offered."""

    def __init__(self, *responses: ModelResponse) -> None:
        self.responses = list(responses)
        self.asked = 0
        self.offered: list[list[str]] = []
        self.inputs: list[Any] = []

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any, tools: Any,
                           *args: Any, **kwargs: Any) -> ModelResponse:
        self.asked += 1
        self.offered.append(sorted(t.name for t in tools))
        self.inputs.append(input)
        return self.responses.pop(0)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


class Services:
    """What the tools did, by idempotency key (a key twice would be a double effect); a refund may be slowed."""

    def __init__(self) -> None:
        self.effects: list[tuple[str, str]] = []
        self.label_delay = 0.0

    def tools(self) -> list[FunctionTool]:
        @function_tool
        async def lookup_order(order_id: str) -> dict[str, Any]:
            """Look an order up."""
            self.effects.append(("lookup", call_context().key))
            return {"order_id": order_id, "amount": 42.5}

        @function_tool
        async def create_label(order_id: str) -> str:
            """Create a return label."""
            await asyncio.sleep(self.label_delay)
            self.effects.append(("label", call_context().key))
            return f"label for {order_id}"

        @function_tool
        async def refund(order_id: str, amount: float) -> str:
            """Refund an order."""
            self.effects.append(("refund", call_context().key))
            return f"refunded {amount:g} on {order_id}"

        return [lookup_order, create_label, refund]


class Journal:
    """The task's record: entries kept once "confirmed"; each dispatch starts from them."""

    def __init__(self) -> None:
        self.entries: list[Any] = []
        self.checks = 0
        self.fenced = False

    def run(self) -> DurableRun:
        async def record(index: int, entry: dict[str, Any]) -> None:
            assert index == len(self.entries)
            json.dumps(entry)  # a journal entry is JSON, as it goes on the wire

        async def check() -> None:
            self.checks += 1
            if self.fenced:
                raise Fenced("this worker left the group")

        return DurableRun(task_id="t1", framework=FRAMEWORK, version="v", entries=self.entries, record=record,
                          check=check, fencing_token=2)


def script() -> list[ModelResponse]:
    """Look up → label and refund (two calls in one turn) → the answer."""
    return [calls(("c1", "lookup_order", {"order_id": "o1"})),
            calls(("c2", "create_label", {"order_id": "o1"}), ("c3", "refund", {"order_id": "o1", "amount": 42.5})),
            text("Refunded 42.50 and sent a label.")]


def support(model: Model, services: Services, **kw: Any) -> Agent[Any]:
    return Agent(name="support", instructions="Resolve the request.", tools=services.tools(), model=model, **kw)


async def test_each_response_and_tool_result_is_journaled_and_tools_get_the_call_key():
    services, model, journal = Services(), Scripted(*script()), Journal()
    agent = support(model, services)
    original = list(agent.tools)
    output = await adapt(agent).run(PROMPT, journal.run())
    assert output == "Refunded 42.50 and sent a label."
    assert model.asked == 3 and model.offered[0] == ["create_label", "lookup_order", "refund"]
    made = [(e["kind"], e["turn"], e.get("id")) for e in journal.entries]
    assert made[:3] == [("turn", 0, None), ("tool", 0, "c1"), ("turn", 1, None)] and made[5] == ("turn", 2, None)
    assert sorted(made[3:5]) == [("tool", 1, "c2"), ("tool", 1, "c3")], "a turn's calls in the order they finished"
    assert all(e["framework"] == "openai_agents" for e in journal.entries)
    assert sorted(services.effects) == [("label", "t1:1:c2"), ("lookup", "t1:0:c1"), ("refund", "t1:1:c3")]
    assert journal.checks == 6, "the membership is asked before every model request and every tool call"
    shown = transcript(journal.entries)
    assert [t["tool_calls"] for t in shown["turns"]] == [["lookup_order"], ["create_label", "refund"], []]
    assert shown["turns"][0]["source"] == "openai_agents:Scripted" and shown["turns"][2]["usage"]["input_tokens"] == 20
    assert journal.entries[1]["result"] == {"order_id": "o1", "amount": 42.5}
    assert agent.model is model and [t.on_invoke_tool for t in agent.tools] == [
        t.on_invoke_tool for t in original], "the user's agent is not changed"


async def test_a_second_dispatch_on_the_whole_journal_asks_nothing_and_runs_nothing():
    services, journal = Services(), Journal()
    await adapt(support(Scripted(*script()), services)).run(PROMPT, journal.run())
    again, before = Scripted(), list(services.effects)
    output = await adapt(support(again, services)).run(PROMPT, journal.run())
    assert output == "Refunded 42.50 and sent a label."
    assert again.asked == 0 and services.effects == before and journal.checks == 6


async def test_a_crash_after_the_refund_asks_only_the_next_turn_and_refunds_once():
    services, journal = Services(), Journal()
    await adapt(support(Scripted(*script()), services)).run(PROMPT, journal.run())
    journal.entries[:] = journal.entries[:5]  # the kill came while turn 2 was asked: not journaled
    resumed = Scripted(text("Done."))
    output = await adapt(support(resumed, services)).run(PROMPT, journal.run())
    assert output == "Done." and resumed.asked == 1
    assert [e for e in services.effects if e[0] == "refund"] == [("refund", "t1:1:c3")]


async def test_a_call_cut_by_the_crash_runs_again_under_its_first_key():
    services, journal = Services(), Journal()
    await adapt(support(Scripted(*script()), services)).run(PROMPT, journal.run())
    journal.entries[:] = [e for e in journal.entries if not (e["kind"] == "tool" and e["id"] == "c3")][:4]
    resumed = Scripted(text("Done."))
    await adapt(support(resumed, services)).run(PROMPT, journal.run())
    assert [e for e in services.effects if e[0] == "refund"] == [("refund", "t1:1:c3"), ("refund", "t1:1:c3")], (
        "the same key both times: the payment service applies it once")
    assert [e for e in services.effects if e[0] == "label"] == [("label", "t1:1:c2")], "the journaled label is not"


async def test_parallel_calls_are_journaled_by_call_id_not_by_the_order_they_finish():
    services, journal = Services(), Journal()
    services.label_delay = 0.05  # the label, asked first, finishes after the refund
    await adapt(support(Scripted(*script()), services)).run(PROMPT, journal.run())
    assert [e.get("id") for e in journal.entries if e["kind"] == "tool"] == ["c1", "c3", "c2"]
    journal.entries[:] = journal.entries[:5]
    resumed = Scripted(text("Done."))
    await adapt(support(resumed, services)).run(PROMPT, journal.run())
    outputs = {i["call_id"]: i["output"] for i in resumed.inputs[0] if i.get("type") == "function_call_output"}
    assert outputs == {"c1": str({"order_id": "o1", "amount": 42.5}), "c2": "label for o1",
                       "c3": "refunded 42.5 on o1"}, "each call is handed its own journaled result"


async def test_a_journal_of_a_tool_this_agent_no_longer_has_ends_the_run_without_calling_anything():
    services, journal = Services(), Journal()
    await adapt(support(Scripted(*script()), services)).run(PROMPT, journal.run())
    journal.entries[:] = journal.entries[:3]  # turn 1 asked for label and refund; neither ran
    before, model = list(services.effects), Scripted(text("never"))
    without = Agent(name="support", instructions="Resolve the request.",
                    tools=[t for t in services.tools() if t.name != "refund"], model=model)
    with pytest.raises(JournalMismatch, match="refund"):
        await adapt(without).run(PROMPT, journal.run())
    assert services.effects == before and model.asked == 0


async def test_a_fenced_run_asks_no_model():
    services, journal, model = Services(), Journal(), Scripted(*script())
    journal.fenced = True
    with pytest.raises(Fenced):
        await adapt(support(model, services)).run(PROMPT, journal.run())
    assert model.asked == 0 and journal.entries == []


async def test_a_run_fenced_after_a_response_runs_none_of_its_tools():
    services, journal, model = Services(), Journal(), Scripted(*script())
    run = journal.run()

    async def fenced_after_the_first_turn() -> None:
        if run.requests >= 1:
            raise Fenced("this worker left the group")

    run.check = fenced_after_the_first_turn
    with pytest.raises(Exception) as raised:  # the SDK wraps what a tool raised: the runner finds the fence in it
        await adapt(support(model, services)).run(PROMPT, run)
    assert isinstance(stopping(raised.value), Fenced), raised.value
    assert model.asked == 1 and services.effects == [], "the lookup the response asked for never ran"


async def test_handoffs_are_journaled_too_and_replayed_without_a_request():
    services, journal = Services(), Journal()
    billing_model = Scripted(calls(("c9", "refund", {"order_id": "o1", "amount": 1.0})), text("Billing refunded."))
    billing = Agent(name="billing", instructions="Refund.", tools=services.tools(), model=billing_model)
    triage_model = Scripted(calls(("c8", "transfer_to_billing", {})))
    triage = Agent(name="triage", instructions="Route.", handoffs=[billing], model=triage_model)
    assert await adapt(triage).run(PROMPT, journal.run()) == "Billing refunded."
    assert [(e["kind"], e["turn"]) for e in journal.entries] == [("turn", 0), ("turn", 1), ("tool", 1), ("turn", 2)]
    again_b, again_t = Scripted(), Scripted()
    replay = Agent(name="triage", instructions="Route.", model=again_t,
                   handoffs=[Agent(name="billing", instructions="Refund.", tools=services.tools(), model=again_b)])
    assert await adapt(replay).run(PROMPT, journal.run()) == "Billing refunded."
    assert again_b.asked == again_t.asked == 0 and len([e for e in services.effects if e[0] == "refund"]) == 1


class Answer(BaseModel):
    refunded: float


async def test_a_structured_output_is_the_result_as_json():
    journal = Journal()
    agent = Agent(name="a", instructions="x", model=Scripted(text('{"refunded": 42.5}')), output_type=Answer)
    assert await adapt(agent).run(PROMPT, journal.run()) == {"refunded": 42.5}


def test_what_would_run_outside_the_journal_is_refused_at_load():
    shell = LocalShellTool(executor=lambda request: "")
    with pytest.raises(ValueError, match="LocalShellTool"):
        adapt(Agent(name="a", instructions="x", tools=[shell]))
    assert adapt(object()) is None and adapt("agents.Agent") is None


def test_connection_errors_and_5xx_hold_the_task_and_a_400_ends_it():
    adapted = adapt(Agent(name="a", instructions="x", model=Scripted()))
    request = httpx2.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    assert adapted.unavailable(openai.APIConnectionError(request=request)) is not None
    for code, held in ((503, True), (429, True), (400, False), (401, False)):
        response = httpx2.Response(code, request=request)
        error = openai.APIStatusError("x", response=response, body=None)
        assert (adapted.unavailable(error) is not None) is held, code
    assert adapted.unavailable(ValueError("bug")) is None


def test_the_config_names_an_unchanged_sdk_agent_and_gets_this_adapter():
    loaded = load_acting("agents_stream.examples.openai_agents_support:SUPPORT")
    assert isinstance(loaded, OpenAIAgentsAgent) and loaded.framework == "openai_agents" and loaded.name == "support"
    assert loaded.agent is SUPPORT and SUPPORT.model is MODEL, "the example's own agent and model client, unchanged"
