"""The Pydantic AI adapter on an unchanged pydantic_ai Agent whose model is a function (no HTTP): a run journals
each request and call, a second run on that journal asks and runs nothing again, a changed agent is refused."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agents_stream.frameworks import adapt, idempotency_key, load_acting
from agents_stream.frameworks.durable import DurableRun, JournalMismatch
from agents_stream.frameworks.pydantic_ai_adapter import PydanticAIAgent


class Script:
    """The model: turn n answers the n-th response; counts the requests."""

    def __init__(self, *responses: ModelResponse) -> None:
        self.responses = responses
        self.asked = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.asked += 1
        return self.responses[sum(1 for m in messages if isinstance(m, ModelResponse))]


def support(script: Script, effects: list[str], *, retry_first: bool = False) -> Agent[None, str]:
    agent = Agent(FunctionModel(script, model_name="scripted"), name="support")
    tries: list[str] = []

    @agent.tool_plain
    async def refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        if retry_first and not tries:
            tries.append(idempotency_key())
            raise ModelRetry("the payment service is busy: try again")
        effects.append(idempotency_key())
        return {"order_id": order_id, "refunded": amount}

    return agent


SCRIPT = (
    ModelResponse(parts=[ToolCallPart("refund", {"order_id": "o1", "amount": 42.5}, tool_call_id="c1")]),
    ModelResponse(parts=[TextPart("Refunded 42.50.")]),
)


def durable(adapted: PydanticAIAgent, entries: list[Any]) -> DurableRun:
    async def record(index: int, entry: dict[str, Any]) -> None:
        pass

    async def check() -> None:
        pass

    return DurableRun(task_id="t1", framework=adapted.framework, version=adapted.version, entries=entries,
                      record=record, check=check)


async def test_a_second_run_on_the_journal_asks_no_model_and_refunds_nothing_again() -> None:
    script, effects, entries = Script(*SCRIPT), [], []
    adapted = adapt(support(script, effects))
    assert isinstance(adapted, PydanticAIAgent)
    assert await adapted.run("refund o1", durable(adapted, entries)) == "Refunded 42.50."
    assert (script.asked, effects) == (2, ["t1:0:c1"])
    assert [(e["kind"], e.get("name")) for e in entries] == [("turn", None), ("tool", "refund"), ("turn", None)]
    assert entries[0]["calls"] == [{"id": "c1", "name": "refund", "arguments": {"order_id": "o1", "amount": 42.5}}]
    assert entries[1]["result"] == {"order_id": "o1", "refunded": 42.5} and entries[2]["text"] == "Refunded 42.50."

    again = durable(adapted, list(entries))
    assert await adapted.run("refund o1", again) == "Refunded 42.50."
    assert (script.asked, effects) == (2, ["t1:0:c1"]), "every request and the refund came from the journal"
    assert (again.replayed_turns, again.replayed_calls, again.asked_turns, again.ran_calls) == (2, 1, 0, 0)


async def test_a_tools_model_retry_is_journaled_and_told_again_on_replay() -> None:
    script = Script(
        SCRIPT[0],
        ModelResponse(parts=[ToolCallPart("refund", {"order_id": "o1", "amount": 42.5}, tool_call_id="c2")]),
        SCRIPT[1],
    )
    effects: list[str] = []
    entries: list[Any] = []
    adapted = adapt(support(script, effects, retry_first=True))
    assert adapted is not None
    await adapted.run("refund o1", durable(adapted, entries))
    assert [e["error"] for e in entries if e["kind"] == "tool"] == [True, False] and effects == ["t1:1:c2"]
    again = durable(adapted, list(entries))
    assert await adapted.run("refund o1", again) == "Refunded 42.50."
    assert script.asked == 3 and effects == ["t1:1:c2"]


async def test_an_agent_whose_tools_changed_does_not_run_another_tool_in_place_of_a_journaled_call() -> None:
    entries: list[Any] = []
    first = adapt(support(Script(*SCRIPT), []))
    assert first is not None
    await first.run("refund o1", durable(first, entries))
    changed = Agent(FunctionModel(Script(*SCRIPT), model_name="scripted"), name="support")

    @changed.tool_plain
    async def charge(order_id: str, amount: float) -> str:
        """Charge an order."""
        raise AssertionError("never runs")

    adapted = adapt(changed)
    assert adapted is not None
    with pytest.raises(JournalMismatch, match="another shape"):
        await adapted.run("refund o1", durable(adapted, entries[:1]))


def test_an_unreachable_model_holds_the_task_and_a_refused_request_ends_it() -> None:
    adapted = adapt(support(Script(*SCRIPT), []))
    assert adapted is not None
    assert adapted.unavailable(ModelHTTPError(503, "m", body="down")) is not None
    assert adapted.unavailable(ModelHTTPError(429, "m", body="slow down")) is not None
    assert adapted.unavailable(ModelHTTPError(401, "m", body="bad key")) is None
    assert adapted.unavailable(ValueError("a bug")) is None


def test_the_config_names_the_example_and_gets_its_adapter() -> None:
    loaded = load_acting("agents_stream.examples.pydantic_support:SUPPORT")
    assert isinstance(loaded, PydanticAIAgent) and loaded.name == "pydantic_support"
    assert loaded.version.startswith("pydantic-ai 2.")


async def test_a_fenced_check_stops_the_run_as_fenced_before_the_model_or_a_tool_is_called() -> None:
    from agents_stream.contract.errors import Fenced
    from agents_stream.frameworks.runner import stopping

    for journaled in (0, 1):  # fenced at the first request; fenced at the refund, its request journaled
        script, effects, entries = Script(*SCRIPT), [], []
        adapted = adapt(support(script, effects))
        assert adapted is not None
        if journaled:
            await adapted.run("refund o1", durable(adapted, entries))
            entries[:] = entries[:1]
            script.asked = 0
        run = durable(adapted, entries)

        async def fenced() -> None:
            raise Fenced("this worker left the group")

        run.check = fenced
        with pytest.raises(BaseException) as raised:
            await adapted.run("refund o1", run)
        assert isinstance(stopping(raised.value), Fenced), raised.value
        assert script.asked == 0 and effects == ([] if not journaled else ["t1:0:c1"])


def test_a_config_names_a_pydantic_ai_agent_without_providers_and_an_agents_stream_agent_still_needs_them() -> None:
    from agents_stream.config import AppConfig
    from agents_stream.execution.plan import AgentPlan
    from agents_stream.providers import build_provider

    def build(agent: dict[str, Any]) -> AgentPlan:
        cfg = AppConfig.model_validate({"providers": {}, "agents": {"x": agent},
                                        "mcp": {"desk": {"url": "http://127.0.0.1:1/mcp"}}})
        return AgentPlan.build(cfg, "x", lambda name: build_provider(cfg.provider(name)))

    plan = build({"agent": "agents_stream.examples.pydantic_support:SUPPORT"})
    assert isinstance(plan.framework, PydanticAIAgent) and plan.agent is None
    with pytest.raises(ValueError, match="give providers"):
        build({"agent": "agents_stream.examples.support:SUPPORT"})
    with pytest.raises(ValueError, match="brings its own tools and model"):
        build({"agent": "agents_stream.examples.pydantic_support:SUPPORT", "mcp": ["desk"]})
