"""Your first agent, tested as a user would: one custom tool, the front door and the harness only (no broker, no
provider). What passes here runs the same in a worker: it is the worker's loop, with a test model."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from agents_stream import Agent, FatalToolError, ToolContext, ToolError, TransientError, agent_tool, tool
from agents_stream.testing import FunctionModel, ModelRequest, ScriptedModel, answer, call, run_agent, turn

STOCK = {"apple": 3, "pear": 0}
seen_keys: list[str] = []


@tool
async def check_stock(ctx: ToolContext, item: str) -> dict[str, Any]:
    """How many of an item are in stock."""
    seen_keys.append(ctx.key)
    if item not in STOCK:
        raise ToolError(f"no such item {item!r}")
    return {"item": item, "count": STOCK[item]}


SHOP = Agent("shop", instructions="You answer stock questions. Check the stock before you answer.",
             tools=[check_stock], max_turns=4)


async def test_a_scripted_model_calls_the_tool_and_answers() -> None:
    run = await run_agent(SHOP, "Do you have apples?", model=ScriptedModel([
        call("check_stock", item="apple"),
        "Yes, 3 apples.",
    ]))
    assert run.status == "succeeded" and run.output == "Yes, 3 apples."
    assert run.tool_names == ["check_stock"]
    (made,) = run.tool_calls
    assert made.arguments == {"item": "apple"} and made.error is False
    assert made.content == '{"count": 3, "item": "apple"}' and made.key == "test-1:0:call_0_0"
    assert seen_keys[-1] == made.key  # the tool got the call's idempotency key
    # the model was shown the instructions, the tool and, at turn 1, the tool's result
    first, second = run.requests
    assert first.tools == ["check_stock"] and "Check the stock" in first.system
    assert [r.content for r in second.results] == [made.content]
    assert run.transcript["tool_calls"][0]["name"] == "check_stock"


async def test_a_function_model_answers_from_what_the_tools_returned() -> None:
    def model(request: ModelRequest) -> Any:
        if request.turn == 0:
            return turn(call("check_stock", item="apple"), call("check_stock", item="kiwi"))
        return answer(f"I read: {[r.content for r in request.results]}")

    run = await run_agent(SHOP, "apples or kiwis?", model=FunctionModel(model))
    assert run.status == "succeeded"
    assert [(c.arguments["item"], c.error) for c in run.tool_calls] == [("apple", False), ("kiwi", True)]
    assert "no such item 'kiwi'" in run.output  # a ToolError is the call's result: the model reads it


async def test_invalid_arguments_go_back_to_the_model_and_limits_hold() -> None:
    run = await run_agent(SHOP, "?", model=[call("check_stock", sku=1)] * 4)
    assert run.status == "failed" and run.reason == "max_turns"
    assert run.tool_calls[0].content.startswith("invalid arguments for check_stock")


class Answer(BaseModel):
    item: str
    in_stock: bool


async def test_an_output_model_answer_is_checked_and_corrected() -> None:
    agent = Agent("shop", instructions="Answer in JSON.", tools=[check_stock], output_model=Answer)
    run = await run_agent(agent, "pears?", model=["no idea", '{"item": "pear", "in_stock": false}'])
    assert run.status == "succeeded" and run.output == {"item": "pear", "in_stock": False}
    assert "Your final answer was rejected" in run.requests[1].messages[-1].text  # type: ignore[union-attr]


attempts: list[int] = []


@tool(retries=1)
async def flaky(ctx: ToolContext) -> str:
    """Fails once, then answers."""
    attempts.append(ctx.attempt)
    if ctx.attempt == 1:
        raise TransientError("try again")
    return "ok"


@tool
def explode() -> str:
    """Ends the task."""
    raise FatalToolError("the shop is closed")


async def test_transient_errors_are_retried_under_one_key_and_fatal_ones_end_the_task() -> None:
    agent = Agent("shop", instructions=".", tools=[flaky, explode])
    run = await run_agent(agent, "go", model=[call("flaky"), call("explode")])
    assert attempts == [1, 2] and run.tool_calls[0].attempts == 2
    assert run.status == "failed" and run.reason == "tool_failed" and "the shop is closed" in (run.error or "")


@tool(approval=lambda args: f"{args.count} is many" if args.count > 10 else None)
async def order(ctx: ToolContext, item: str, count: int) -> str:
    """Order more of an item."""
    return f"ordered {count} {item}"


async def test_a_call_that_needs_approval_parks_or_is_decided() -> None:
    agent = Agent("shop", instructions=".", tools=[order])
    script = [call("order", item="pear", count=50), "done"]
    parked = await run_agent(agent, "restock", model=script)
    assert parked.status == "parked" and parked.waiting == (0, "call_0_0", "order", "tool order: 50 is many")
    assert parked.tool_calls == []  # nothing ran
    approved = await run_agent(agent, "restock", model=script, approve=True)
    assert approved.status == "succeeded" and approved.tool_calls[0].content == "ordered 50 pear"
    rejected = await run_agent(agent, "restock", model=script, approve=lambda tool, args: args["count"] < 20)
    assert rejected.tool_calls[0].content == "rejected by test" and rejected.tool_calls[0].error


async def test_an_agent_tool_is_answered_by_a_test_sub_agent() -> None:
    lead = Agent("lead", instructions=".", tools=[agent_tool("analyzer", "Ask the analyst.")])
    script = [call("analyzer", instruction="sum it", context={"a": 1}), "the analyst says 1"]
    waiting = await run_agent(lead, "report", model=script)
    assert waiting.status == "delegated" and waiting.waiting[0]["agent"] == "analyzer"
    run = await run_agent(lead, "report", model=script, agents={"analyzer": lambda instruction, context: context})
    assert run.status == "succeeded" and run.tool_calls[0].content == '{"a": 1}'
