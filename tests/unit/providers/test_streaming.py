"""Streamed provider calls against real servers over HTTP (the fake LLM's streaming mode, and aiohttp servers for
what it does not say): the text arrives in pieces, the Completion or Turn is the non-streaming one, a cut stream
fails as a retryable error."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from agents_stream.config import ProviderConfig
from agents_stream.contract.errors import PermanentError, RateLimited, TransientError
from agents_stream.providers import Prompt, Provider, build_provider
from agents_stream.providers.conversation import Conversation, ToolResult, ToolSpec, UserText
from agents_stream.providers.sse import SSEEvent, SSEParser
from agents_stream.testing.fakellm import FakeLLM, call, ok, refusal, status, tool_calls

KEY = "sk-stream-5e4d3c2b1a-not-a-real-key"
FAKE_LLM_KEY = KEY  # the key the shared `fake` server asks for (tests/unit/conftest.py)
ENV = "AGENTS_STREAM_TEST_STREAM_KEY"
PROMPT = Prompt(instruction="Tell me about task_id=t-7", system="Be brief.")
TEXT = "Your refund of 42 EUR is on its way; it should reach your card within five working days."
TOOLS = (ToolSpec("refund", "Refund an order", {"type": "object", "properties": {"order": {"type": "string"}}}),)
CONVERSATION = Conversation(system="You help.", messages=(UserText("refund o-7, task_id=t-8"),), tools=TOOLS)

MakeProvider = Callable[[str], Provider]


def config(api: str, url: str, **more: object) -> ProviderConfig:
    base = f"{url}/v1" if api == "openai" else url
    settings: dict[str, Any] = {"name": f"s-{api}", "kind": api, "base_url": base, "model": "fake-model",
                                   "api_key_env": ENV, "timeout_s": 5.0, **more}
    return ProviderConfig(**settings)


@pytest_asyncio.fixture
async def make(fake: FakeLLM, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[MakeProvider]:
    monkeypatch.setenv(ENV, KEY)
    made: list[Provider] = []

    def _make(api: str) -> Provider:
        made.append(build_provider(config(api, fake.url)))
        return made[-1]

    yield _make
    for provider in made:
        await provider.close()


APIS = pytest.mark.parametrize("api", ["gemini", "openai", "anthropic"])


@APIS
async def test_a_streamed_completion_is_the_completion(api: str, fake: FakeLLM, make: MakeProvider) -> None:
    provider = make(api)
    fake.enqueue(ok(TEXT, input_tokens=11, output_tokens=17), ok(TEXT, input_tokens=11, output_tokens=17))
    whole = await provider.complete(PROMPT)
    got: list[str] = []
    streamed = await provider.complete_stream(PROMPT, got.append)
    assert streamed == whole
    assert len(got) > 3 and "".join(got) == TEXT
    asked = fake.requests[-1]
    assert asked.path.endswith(":streamGenerateContent") if api == "gemini" else asked.body["stream"] is True
    assert KEY not in str(asked.as_dict())


@APIS
async def test_a_streamed_turn_is_the_turn(api: str, fake: FakeLLM, make: MakeProvider) -> None:
    provider = make(api)
    reply = tool_calls(call("refund", {"order": "o-7", "amount": 42}, id="call_1"),
                       call("notify", {"text": "done"}, id="call_2"), text="Let me refund that.")
    fake.enqueue(reply, reply)
    whole = await provider.converse(CONVERSATION)
    got: list[str] = []
    streamed = await provider.converse_stream(CONVERSATION, got.append)
    assert streamed == whole
    assert [c.name for c in streamed.calls] == ["refund", "notify"]
    assert streamed.calls[0].arguments == {"order": "o-7", "amount": 42}
    assert "".join(got) == "Let me refund that."
    # the next turn, with the tools' results, streams its text too
    after = Conversation(system="", messages=(*CONVERSATION.messages, ToolResult("call_1", "refund", "{}")),
                         tools=TOOLS)
    fake.enqueue(ok(TEXT))
    got.clear()
    final = await provider.converse_stream(after, got.append)
    assert final.text == TEXT == "".join(got) and final.calls == ()


@APIS
async def test_a_stream_cut_midway_fails_retryably_and_the_retry_streams_anew(
    api: str, fake: FakeLLM, make: MakeProvider,
) -> None:
    provider = make(api)
    fake.enqueue(ok(TEXT, cut_after=3), ok(TEXT))
    first: list[str] = []
    with pytest.raises(TransientError) as caught:
        await provider.converse_stream(CONVERSATION, first.append)
    assert 0 < len(first) <= 3 and TEXT.startswith("".join(first)) and "".join(first) != TEXT
    assert KEY not in str(caught.value)
    second: list[str] = []
    turn = await provider.converse_stream(CONVERSATION, second.append)
    assert turn.text == TEXT == "".join(second)


@APIS
async def test_refusals_and_statuses_are_the_same_errors_streamed(api: str, fake: FakeLLM, make: MakeProvider) -> None:
    provider = make(api)
    fake.enqueue(refusal(), status(429, retry_after=7), status(503))
    with pytest.raises(PermanentError):
        await provider.complete_stream(PROMPT, lambda text: None)
    with pytest.raises(RateLimited) as limited:
        await provider.complete_stream(PROMPT, lambda text: None)
    assert limited.value.retry_after == 7.0
    with pytest.raises(TransientError):
        await provider.complete_stream(PROMPT, lambda text: None)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest_asyncio.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def _serve(handler: Handler) -> str:
        app = web.Application()
        app.router.add_post("/{tail:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield _serve
    for runner in runners:
        await runner.cleanup()


async def _sse(request: web.Request, raw: bytes) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(raw)
    await response.write_eof()
    return response


async def test_an_anthropic_error_event_midway_is_retryable(serve: Callable[[Handler], Awaitable[str]]) -> None:
    raw = (b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":3}}}\n\n'
           b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
           b'"content_block":{"type":"text","text":""}}\n\n'
           b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
           b'"delta":{"type":"text_delta","text":"Hel"}}\n\n'
           b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n')

    async def handler(request: web.Request) -> web.StreamResponse:
        return await _sse(request, raw)

    provider = build_provider(config("anthropic", await serve(handler), api_key_env=None))
    got: list[str] = []
    try:
        with pytest.raises(TransientError, match="529"):
            await provider.complete_stream(PROMPT, got.append)
    finally:
        await provider.close()
    assert got == ["Hel"]


async def test_a_gateway_that_answers_whole_is_read_whole(serve: Callable[[Handler], Awaitable[str]]) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        assert (await request.json())["stream"] is True
        return web.json_response({"choices": [{"message": {"content": "all at once"}, "finish_reason": "stop"}],
                                  "usage": {"prompt_tokens": 2, "completion_tokens": 3}})

    provider = build_provider(config("openai", await serve(handler), api_key_env=None))
    got: list[str] = []
    try:
        completion = await provider.complete_stream(PROMPT, got.append)
    finally:
        await provider.close()
    assert completion.text == "all at once" and got == ["all at once"] and completion.usage.output_tokens == 3


async def test_a_server_that_refuses_stream_options_is_asked_whole_from_then_on(
    serve: Callable[[Handler], Awaitable[str]],
) -> None:
    asked: list[dict[str, object]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        asked.append(body)
        if "stream_options" in body:
            return web.json_response({"error": {"message": "Unrecognized request argument supplied: stream_options"}},
                                     status=400)
        return web.json_response({"choices": [{"message": {"content": "whole"}, "finish_reason": "stop"}]})

    provider = build_provider(config("openai", await serve(handler), api_key_env=None))
    strict = build_provider(config("openai", await serve(_bad_request), api_key_env=None))
    got: list[str] = []
    try:
        assert (await provider.complete_stream(PROMPT, got.append)).text == "whole"
        assert (await provider.complete_stream(PROMPT, got.append)).text == "whole"
        with pytest.raises(PermanentError):  # any other 400 is the task's fault, as unstreamed
            await strict.complete_stream(PROMPT, got.append)
    finally:
        await provider.close()
        await strict.close()
    assert ["stream" in body for body in asked] == [True, False, False] and got == ["whole", "whole"]


async def _bad_request(request: web.Request) -> web.StreamResponse:
    return web.json_response({"error": {"message": "the prompt is too long"}}, status=400)


async def test_an_openai_stream_without_done_is_malformed(serve: Callable[[Handler], Awaitable[str]]) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await _sse(request, b'data: {"choices":[{"index":0,"delta":{"content":"half"}}]}\n\n')

    provider = build_provider(config("openai", await serve(handler), api_key_env=None))
    try:
        with pytest.raises(TransientError, match="malformed"):
            await provider.complete_stream(PROMPT, lambda text: None)
    finally:
        await provider.close()


async def test_a_stream_past_max_body_bytes_is_too_large(serve: Callable[[Handler], Awaitable[str]]) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        piece = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"x" * 500 + b'"}}]}\n\n'
        return await _sse(request, piece * 20)

    provider = build_provider(config("openai", await serve(handler), api_key_env=None, max_body_bytes=4000))
    try:
        with pytest.raises(PermanentError, match="result_too_large"):
            await provider.complete_stream(PROMPT, lambda text: None)
    finally:
        await provider.close()


def test_the_sse_parser_reads_events_however_the_bytes_are_cut() -> None:
    raw = b": comment\r\nevent: one\r\ndata: a\r\ndata:b\r\n\r\ndata: {\"x\": 1}\n\nid: 3\nretry: 5\ndata: \xc3\xa9\r\r"
    whole = SSEParser().feed(raw)
    assert whole == [SSEEvent("one", "a\nb"), SSEEvent("message", '{"x": 1}'), SSEEvent("message", "\u00e9")]
    for size in (1, 2, 3, 7):
        parser = SSEParser()
        got = [e for i in range(0, len(raw), size) for e in parser.feed(raw[i:i + size])]
        assert got == whole, size
