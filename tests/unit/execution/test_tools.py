"""@tool: the JSON Schema a model is shown, the arguments it may send, the context a tool gets, the bounds."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Literal

import pytest
from pydantic import BaseModel

from agents_stream.contract.models import TaskPayload
from agents_stream.execution.agent_definitions import Agent, load_agent
from agents_stream.execution.tools import Tool, ToolContext, ToolError, result_text, tool


class Address(BaseModel):
    street: str
    city: str


@tool
async def create_label(ctx: ToolContext, order_id: str, service: Literal["ground", "air"] = "ground",
                       to: Address | None = None) -> dict:
    """Create a return label for an order.

    Longer notes the model does not need.
    """
    return {"order_id": order_id, "service": service, "key": ctx.key}


def context(timeout: float = 5.0) -> ToolContext:
    task = TaskPayload(task_id="t-1", agent_name="a", instruction="x")
    return ToolContext(task=task, turn=0, call_id="c", key="t-1:0:c", attempt=1, deadline=time.time() + timeout,
                       log=logging.LoggerAdapter(logging.getLogger("t"), {}))


def test_the_schema_comes_from_the_type_hints_and_the_description_from_the_docstring() -> None:
    spec = create_label.spec
    assert spec.name == "create_label" and spec.description == "Create a return label for an order."
    params = spec.parameters
    assert params["type"] == "object" and params["required"] == ["order_id"]
    assert params["properties"]["service"]["enum"] == ["ground", "air"]
    assert params["additionalProperties"] is False
    assert "ctx" not in params["properties"], "the context is not the model's to send"
    assert "Address" in str(params["$defs"])


def test_arguments_are_validated_with_a_message_the_model_can_act_on() -> None:
    with pytest.raises(ToolError, match=r"order_id: Field required"):
        create_label.validate({})
    with pytest.raises(ToolError, match=r"service: Input should be 'ground' or 'air'"):
        create_label.validate({"order_id": "o", "service": "sea"})
    with pytest.raises(ToolError, match=r"extra: Extra inputs are not permitted"):
        create_label.validate({"order_id": "o", "extra": 1})
    parsed = create_label.validate({"order_id": "o", "to": {"street": "s", "city": "c"}})
    assert parsed.to == Address(street="s", city="c")  # type: ignore[attr-defined]


async def test_invoke_hands_over_the_context_and_the_parsed_arguments() -> None:
    out = await create_label.invoke(context(), create_label.validate({"order_id": "o-1"}))
    assert out == {"order_id": "o-1", "service": "ground", "key": "t-1:0:c"}


async def test_a_tool_without_context_and_a_synchronous_one_run_too() -> None:
    @tool(name="add", description="Adds.")
    def add(a: int, b: int = 1) -> int:
        return a + b

    assert not add.takes_context and add.spec.description == "Adds."
    assert await add.invoke(context(), add.validate({"a": 2})) == 3


async def test_an_attempt_past_its_timeout_is_cancelled() -> None:
    @tool(timeout_s=0.05)
    async def slow(ctx: ToolContext) -> str:
        """Sleeps."""
        await asyncio.sleep(5)
        return "late"

    with pytest.raises(TimeoutError):
        await slow.invoke(context(), slow.validate({}))


def test_a_tool_that_cannot_be_described_is_refused_at_definition() -> None:
    def untyped(ctx: ToolContext, x):  # type: ignore[no-untyped-def]
        return x

    with pytest.raises(ValueError, match="needs a type hint"):
        tool(untyped)

    def star(*args: int) -> int:
        return 0

    with pytest.raises(ValueError, match=r"\*args"):
        tool(star)
    with pytest.raises(ValueError, match="timeout_s"):
        tool(timeout_s=0)(star)


def test_results_are_text_for_the_model() -> None:
    assert result_text("plain") == "plain"
    assert result_text({"b": 1, "a": "é"}) == '{"a": "é", "b": 1}'
    assert result_text(Address(street="s", city="c")) == '{"street":"s","city":"c"}'


SAMPLE = Agent("sample", "Do it.", tools=[create_label])


def test_agents_load_by_path_and_refuse_what_is_not_one() -> None:
    assert load_agent("tests.unit.execution.test_tools:SAMPLE") is SAMPLE
    for bad, why in [("nocolon", "expected"), ("tests.unit.execution.test_tools:nothing", "cannot be loaded"),
                     ("tests.unit.execution.test_tools:create_label", "is not an agents_stream Agent")]:
        with pytest.raises(ValueError, match=why):
            load_agent(bad)
    with pytest.raises(ValueError, match="share a name"):
        Agent("x", "y", tools=[create_label, create_label])
    assert isinstance(SAMPLE.tools, tuple) and isinstance(SAMPLE.by_name["create_label"], Tool)


def test_a_module_python_cannot_find_is_one_line_saying_where_modules_are_looked_up() -> None:
    """issue 29 item 4: not a traceback ending ``No module named 'weather_agent'``."""
    with pytest.raises(ValueError) as raised:
        load_agent("weather_agent_nowhere:AGENT")
    said = str(raised.value)
    assert "\n" not in said and "no module named 'weather_agent_nowhere'" in said
    assert "PYTHONPATH" in said and "docs/guide/agents.md" in said
    with pytest.raises(ValueError, match="has no 'AGENT'"):
        load_agent("tests.unit.execution.test_tools:AGENT")


def test_the_agents_guides_first_example_runs_as_written() -> None:
    """docs/guide/agents.md's first code block defines everything it uses (issue 29 item 4)."""
    import asyncio
    import pathlib
    import re

    from agents_stream.contract.models import TaskPayload
    from agents_stream.execution.tools import ToolContext

    guide = pathlib.Path(__file__).parents[3] / "docs" / "guide" / "agents.md"
    block = re.search(r"```python\n(.*?)```", guide.read_text(encoding="utf-8"), re.S)
    assert block is not None
    space: dict = {}
    exec(compile(block.group(1), "agents.md", "exec"), space)  # noqa: S102 (our own documentation)
    support = space["SUPPORT"]
    assert isinstance(support, Agent) and set(support.by_name) == {"lookup_order", "refund"}
    ctx = ToolContext(task=TaskPayload(task_id="t-1", agent_name="support", instruction="x"), turn=0, call_id="c",
                      key="t-1:0:c", attempt=1, deadline=0.0, log=logging.LoggerAdapter(logging.getLogger("agents.md")))
    lookup = support.by_name["lookup_order"]
    assert asyncio.run(lookup.invoke(ctx, lookup.validate({"order_id": "o-1"})))["amount"] == 42.5
