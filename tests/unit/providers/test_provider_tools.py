"""Function calling in the three wire formats, over real HTTP against the fake LLM: the same conversation out,
the same turns back, and a conversation begun on one API carried on by another."""

from __future__ import annotations

import pytest

from agents_stream.config import ProviderConfig
from agents_stream.contract.errors import TransientError
from agents_stream.providers import Provider, build_provider
from agents_stream.providers.conversation import (
    AssistantTurn,
    Conversation,
    ToolCall,
    ToolResult,
    ToolSpec,
    UserText,
)
from agents_stream.testing.fakellm import FakeLLM, call, ok, status, tool_calls

APIS = ["gemini", "openai", "anthropic"]
LOOKUP = ToolSpec("lookup_order", "Look an order up.", {
    "type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"],
})
REFUND = ToolSpec("refund", "Refund an order.", {
    "type": "object", "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
    "required": ["order_id", "amount"],
})
HISTORY = Conversation(
    system="You are support.",
    messages=(
        UserText("[task_id=t-9]\nRefund order o-1"),
        AssistantTurn("Looking it up.", (ToolCall("call_a", "lookup_order", {"order_id": "o-1"}),
                                         ToolCall("call_b", "lookup_order", {"order_id": "o-2"}))),
        ToolResult("call_a", "lookup_order", '{"amount": 42.5}'),
        ToolResult("call_b", "lookup_order", "no such order", error=True),
    ),
    tools=(LOOKUP, REFUND),
)


def provider_for(fake: FakeLLM, api: str) -> Provider:
    base_url = f"{fake.url}/v1" if api == "openai" else fake.url
    return build_provider(ProviderConfig(name=f"p-{api}", kind=api, base_url=base_url, model="fake-model",
                                         timeout_s=5.0))


@pytest.mark.parametrize("api", APIS)
async def test_a_scripted_tool_call_comes_back_as_calls_with_their_arguments(fake: FakeLLM, api: str) -> None:
    fake.enqueue(tool_calls(call("refund", {"order_id": "o-1", "amount": 42.5}, id="call_r"),
                            call("lookup_order", {"order_id": "o-3"}), text="Refunding."))
    provider = provider_for(fake, api)
    try:
        turn = await provider.converse(HISTORY)
    finally:
        await provider.close()
    assert [(c.name, c.arguments, c.error) for c in turn.calls] == [
        ("refund", {"order_id": "o-1", "amount": 42.5}, None), ("lookup_order", {"order_id": "o-3"}, None),
    ]
    assert turn.calls[0].id == "call_r"
    assert turn.calls[1].id != "" or api == "gemini", "OpenAI and Anthropic always name their calls"
    assert turn.text == "Refunding." and turn.usage.output_tokens > 0
    assert fake.requests[-1].task_id == "t-9"


@pytest.mark.parametrize("api", APIS)
async def test_the_history_and_tools_go_out_in_the_apis_own_shape(fake: FakeLLM, api: str) -> None:
    fake.enqueue(ok("Refunded."))
    provider = provider_for(fake, api)
    try:
        turn = await provider.converse(HISTORY)
    finally:
        await provider.close()
    assert turn.text == "Refunded." and turn.calls == ()
    body = fake.requests[-1].body
    if api == "openai":
        assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool", "tool"]
        asked = body["messages"][2]["tool_calls"]
        assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in asked] == [
            ("call_a", "lookup_order", '{"order_id": "o-1"}'), ("call_b", "lookup_order", '{"order_id": "o-2"}')]
        assert body["messages"][3] == {"role": "tool", "tool_call_id": "call_a", "content": '{"amount": 42.5}'}
        assert [t["function"]["name"] for t in body["tools"]] == ["lookup_order", "refund"]
        assert body["tools"][1]["function"]["parameters"] == REFUND.parameters
    elif api == "anthropic":
        assert body["system"] == "You are support."
        assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
        blocks = body["messages"][1]["content"]
        assert [b["type"] for b in blocks] == ["text", "tool_use", "tool_use"]
        results = body["messages"][2]["content"]
        assert [(r["tool_use_id"], r["is_error"]) for r in results] == [("call_a", False), ("call_b", True)]
        assert body["tools"][1] == {"name": "refund", "description": "Refund an order.",
                                    "input_schema": REFUND.parameters}
    else:
        assert body["systemInstruction"] == {"parts": [{"text": "You are support."}]}
        assert [c["role"] for c in body["contents"]] == ["user", "model", "user"]
        asked = [p["functionCall"] for p in body["contents"][1]["parts"] if "functionCall" in p]
        assert asked[0] == {"id": "call_a", "name": "lookup_order", "args": {"order_id": "o-1"}}
        answers = [p["functionResponse"] for p in body["contents"][2]["parts"]]
        assert answers == [
            {"id": "call_a", "name": "lookup_order", "response": {"result": '{"amount": 42.5}'}},
            {"id": "call_b", "name": "lookup_order", "response": {"error": "no such order"}},
        ]
        declared = body["tools"][0]["functionDeclarations"]
        assert [d["name"] for d in declared] == ["lookup_order", "refund"]
        assert declared[1]["parametersJsonSchema"] == REFUND.parameters


@pytest.mark.parametrize("api", APIS)
async def test_arguments_that_are_not_an_object_come_back_as_the_calls_error(fake: FakeLLM, api: str) -> None:
    broken = '{"order_id": ' if api == "openai" else ["not", "an", "object"]
    fake.enqueue(tool_calls(call("lookup_order", broken)))  # type: ignore[arg-type]
    provider = provider_for(fake, api)
    try:
        turn = await provider.converse(HISTORY)
    finally:
        await provider.close()
    assert turn.calls[0].name == "lookup_order" and turn.calls[0].arguments == {}
    assert turn.calls[0].error is not None and ("JSON" in turn.calls[0].error)


@pytest.mark.parametrize("api", APIS)
async def test_errors_of_a_turn_are_the_same_typed_errors_as_a_completions(fake: FakeLLM, api: str) -> None:
    fake.enqueue(status(503))
    provider = provider_for(fake, api)
    try:
        with pytest.raises(TransientError):
            await provider.converse(HISTORY)
    finally:
        await provider.close()


@pytest.mark.parametrize(("first", "then"), [("openai", "anthropic"), ("anthropic", "gemini"), ("gemini", "openai")])
async def test_a_conversation_begun_on_one_api_goes_on_on_another(fake: FakeLLM, first: str, then: str) -> None:
    """The ladder moves a loop to the alternate mid-conversation: the turn the first API gave is sent to the next
    one in that one's shape (ids it cannot take are made acceptable), and the next API's answer reads the same."""
    fake.enqueue(tool_calls(call("lookup_order", {"order_id": "o-1"}, id="toolu:1/x")), ok("Done."))
    one, two = provider_for(fake, first), provider_for(fake, then)
    try:
        turn = await one.converse(HISTORY)
        calls = tuple(c if c.id else ToolCall("call_1_0", c.name, c.arguments) for c in turn.calls)
        carried = Conversation(HISTORY.system, (*HISTORY.messages, AssistantTurn(turn.text, calls),
                                                ToolResult(calls[0].id, "lookup_order", '{"amount": 1}')),
                               HISTORY.tools)
        answer = await two.converse(carried)
    finally:
        await one.close()
        await two.close()
    assert answer.text == "Done."
    sent = fake.requests[-1]
    assert sent.api == then and "lookup_order" in str(sent.body) and '{"amount": 1}' in str(sent.body)
    if then == "anthropic":
        ids = [b.get("id") or b.get("tool_use_id") for m in sent.body["messages"] if isinstance(m["content"], list)
               for b in m["content"] if b["type"] in ("tool_use", "tool_result")]
        assert all(i and all(ch.isalnum() or ch in "_-" for ch in i) for i in ids), ids


async def test_the_local_provider_answers_a_conversation_without_calling_tools() -> None:
    provider = build_provider(ProviderConfig(name="local", kind="local"))
    turn = await provider.converse(HISTORY)
    assert turn.calls == () and turn.text.startswith("[local:local-echo] [task_id=t-9]")


@pytest.mark.parametrize("api", APIS)
async def test_the_fakes_tool_turns_mode_answers_every_conversation_by_its_turn(fake: FakeLLM, api: str) -> None:
    """For benchmarks: a request carrying n model turns gets a call of tool_turns[n]; past them, the default."""
    await fake.set_mode(tool_turns=["fetch", "store"])
    provider = provider_for(fake, api)
    try:
        first = await provider.converse(Conversation("", (UserText("[task_id=b-1]\ngo"),), (LOOKUP,)))
        second = await provider.converse(HISTORY)  # one model turn so far
        carried = Conversation("", (*HISTORY.messages, AssistantTurn("", (ToolCall("x", "store", {}),)),
                                    ToolResult("x", "store", "ok")), HISTORY.tools)
        last = await provider.converse(carried)
    finally:
        await provider.close()
    assert [c.name for c in first.calls] == ["fetch"] and [c.name for c in second.calls] == ["store"]
    assert last.calls == () and last.text.startswith(f"[fake:{api}]")
    fake.reset()
    assert fake.mode.tool_turns == ()
