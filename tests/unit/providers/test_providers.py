"""Provider clients against the real fake LLM server over HTTP on 127.0.0.1 (no patched clients)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
import pytest_asyncio

from agents_stream.config import ProviderConfig
from agents_stream.contract.errors import (
    PermanentError,
    RateLimited,
    SystemicError,
    TaskError,
    TransientError,
)
from agents_stream.providers import Prompt, Provider, Usage, build_provider, render_prompt
from agents_stream.providers.anthropic import ANTHROPIC_VERSION, AnthropicProvider
from agents_stream.providers.http import GATEWAY_RETRY_AFTER, error_for, parse_retry_after
from agents_stream.providers.local import LocalProvider
from agents_stream.testing.fakellm import FakeLLM, hang, malformed, ok, refusal, status

KEY = "sk-test-0f9e8d7c6b5a-not-a-real-key"
FAKE_LLM_KEY = KEY  # the key the shared `fake` server asks for (tests/unit/conftest.py)
ENV = {
    "gemini": "AGENTS_STREAM_TEST_GEMINI_KEY",
    "openai": "AGENTS_STREAM_TEST_OPENAI_KEY",
    "anthropic": "AGENTS_STREAM_TEST_ANTHROPIC_KEY",
}
AUTH_HEADER = {"gemini": "x-goog-api-key", "openai": "authorization", "anthropic": "x-api-key"}
PROMPT = Prompt(instruction="Summarise task_id=t-42 please", system="Be brief.", context={"doc": "abc"})

MakeProvider = Callable[..., Provider]


@pytest.fixture(params=["gemini", "openai", "anthropic"])
def api(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest_asyncio.fixture
async def make(fake: FakeLLM, api: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[MakeProvider]:
    monkeypatch.setenv(ENV[api], KEY)
    made: list[Provider] = []

    def _make(**overrides: object) -> Provider:
        # OpenAI-compatible base URLs carry the version; Gemini's and Anthropic's API paths add their own
        base_url = f"{fake.url}/v1" if api == "openai" else fake.url
        settings: dict[str, object] = {
            "name": f"test-{api}",
            "kind": api,
            "base_url": base_url,
            "model": "fake-model",
            "api_key_env": ENV[api],
            "timeout_s": 5.0,
        }
        settings.update(overrides)
        provider = build_provider(ProviderConfig(**settings))
        made.append(provider)
        return provider

    yield _make
    for provider in made:
        await provider.close()


async def fails(provider: Provider, expected: type[TaskError]) -> TaskError:
    """The error ``complete`` raised, checked for its type and for the key leaking into it."""
    with pytest.raises(expected) as caught:
        await asyncio.wait_for(provider.complete(PROMPT), 10)
    error: BaseException | None = caught.value
    while error is not None:  # the key must not ride along in a chained cause either
        assert KEY not in str(error) and KEY not in repr(error)
        error = error.__cause__ or error.__context__
    return caught.value


@pytest.mark.asyncio
async def test_ok_returns_text_and_usage(fake: FakeLLM, make: MakeProvider, api: str) -> None:
    """A 200 in the API's shape becomes a Completion with the text and the reported token usage."""
    fake.enqueue(ok("hello there", input_tokens=11, output_tokens=2))
    completion = await make().complete(PROMPT)
    assert completion.text == "hello there"
    assert completion.usage == Usage(input_tokens=11, output_tokens=2)
    assert (completion.provider, completion.model) == (f"test-{api}", "fake-model")


@pytest.mark.asyncio
async def test_request_carries_prompt_system_and_max_tokens(fake: FakeLLM, make: MakeProvider, api: str) -> None:
    """The instruction, JSON context, system text and token cap reach the API in its own fields."""
    await make().complete(Prompt("Do it task_id=t-7", system="Sys.", context={"k": 1}, max_tokens=33))
    (seen,) = fake.requests
    assert seen.instruction == render_prompt(Prompt("Do it task_id=t-7", context={"k": 1}))
    assert seen.system == "Sys."
    assert seen.task_id == "t-7"
    if api == "gemini":
        assert seen.path == "/v1beta/models/fake-model:generateContent"
        assert seen.body["generationConfig"]["maxOutputTokens"] == 33
    elif api == "anthropic":
        assert seen.path == "/v1/messages"
        assert seen.body["max_tokens"] == 33 and seen.body["model"] == "fake-model"
        assert seen.body["system"] == "Sys."
    else:
        assert seen.path == "/v1/chat/completions"
        assert seen.body["max_tokens"] == 33 and seen.body["model"] == "fake-model"


@pytest.mark.asyncio
async def test_429_is_rate_limited_with_retry_after(fake: FakeLLM, make: MakeProvider) -> None:
    """A 429 with Retry-After: 3 becomes RateLimited carrying retry_after=3.0."""
    fake.enqueue(status(429, retry_after=3))
    error = await fails(make(), RateLimited)
    assert error.retry_after == 3.0
    assert error.retriable


@pytest.mark.asyncio
async def test_429_with_http_date_retry_after(fake: FakeLLM, make: MakeProvider) -> None:
    """A Retry-After given as an HTTP-date is turned into seconds from now."""
    later = datetime.now(UTC) + timedelta(seconds=30)
    fake.enqueue(status(429, retry_after=format_datetime(later, usegmt=True)))
    error = await fails(make(), RateLimited)
    assert error.retry_after is not None and 25 <= error.retry_after <= 31


@pytest.mark.asyncio
async def test_429_without_retry_after(fake: FakeLLM, make: MakeProvider) -> None:
    """A 429 that names no delay leaves retry_after None, so the backoff policy decides."""
    fake.enqueue(status(429))
    assert (await fails(make(), RateLimited)).retry_after is None


def test_429_behind_a_gateway_reads_the_forwarded_retry_after() -> None:
    """A LiteLLM proxy forwards the provider's Retry-After as llm_provider-retry-after (its own rpm limiter sends only
    that too): a 429 without a Retry-After of its own waits that long; one with its own keeps it."""
    config = ProviderConfig(name="gateway", kind="openai", model="m")
    forwarded = error_for(config, status=429, headers={GATEWAY_RETRY_AFTER: "60"})
    assert isinstance(forwarded, RateLimited) and forwarded.retry_after == 60.0
    assert "retry after 60s" in str(forwarded)
    both = error_for(config, status=429, headers={"Retry-After": "3", GATEWAY_RETRY_AFTER: "60"})
    assert isinstance(both, RateLimited) and both.retry_after == 3.0
    unreadable = error_for(config, status=429, headers={"Retry-After": "soon", GATEWAY_RETRY_AFTER: "7"})
    assert isinstance(unreadable, RateLimited) and unreadable.retry_after == 7.0
    neither = error_for(config, status=429, headers={GATEWAY_RETRY_AFTER: "later"})
    assert isinstance(neither, RateLimited) and neither.retry_after is None


def test_parse_retry_after_forms() -> None:
    """Retry-After parses as seconds or HTTP-date; garbage and absence give None; the past gives 0."""
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("3", now=now) == 3.0
    assert parse_retry_after(" 1.5 ", now=now) == 1.5
    assert parse_retry_after("Wed, 01 Jan 2025 12:00:10 GMT", now=now) == 10.0
    assert parse_retry_after("Wed, 01 Jan 2025 11:00:00 GMT", now=now) == 0.0
    assert parse_retry_after("soon", now=now) is None
    assert parse_retry_after(None) is None
    assert parse_retry_after("") is None


@pytest.mark.asyncio
@pytest.mark.parametrize("code", [500, 502, 503, 504])
async def test_5xx_is_transient(fake: FakeLLM, make: MakeProvider, code: int) -> None:
    """A 5xx is a TransientError (retriable) and not a rate limit."""
    fake.enqueue(status(code))
    error = await fails(make(), TransientError)
    assert not isinstance(error, RateLimited)
    assert str(code) in str(error)


@pytest.mark.asyncio
@pytest.mark.parametrize("code", [400, 404, 422])
async def test_4xx_is_permanent(fake: FakeLLM, make: MakeProvider, code: int) -> None:
    """400/404/422 are the task's own fault: PermanentError, not retriable."""
    fake.enqueue(status(code, body={"error": {"message": "bad thing in the request"}}))
    error = await fails(make(), PermanentError)
    assert not error.retriable
    assert "bad thing in the request" in str(error)


@pytest.mark.asyncio
@pytest.mark.parametrize("code", [401, 403])
async def test_auth_failure_is_systemic_and_names_the_variable(
    fake: FakeLLM, make: MakeProvider, api: str, code: int
) -> None:
    """401/403 are SystemicError whose message says which environment variable to check."""
    fake.enqueue(status(code))
    error = await fails(make(), SystemicError)
    assert ENV[api] in str(error)


@pytest.mark.asyncio
async def test_wrong_key_rejected_by_server_is_systemic(
    fake: FakeLLM, make: MakeProvider, api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key the server rejects (its own 401, not a scripted one) is a SystemicError."""
    monkeypatch.setenv(ENV[api], "sk-wrong")
    await fails(make(), SystemicError)
    assert fake.requests[0].status == 401


@pytest.mark.asyncio
async def test_refusal_is_permanent(fake: FakeLLM, make: MakeProvider) -> None:
    """A content-filter answer is a PermanentError: retrying the same prompt will not help."""
    fake.enqueue(refusal())
    error = await fails(make(), PermanentError)
    assert "refused" in str(error)


@pytest.mark.asyncio
@pytest.mark.parametrize("api", ["gemini"])
async def test_gemini_blocked_prompt_is_permanent(fake: FakeLLM, make: MakeProvider) -> None:
    """Gemini's promptFeedback.blockReason is a refusal: PermanentError."""
    fake.enqueue(status(200, body={"promptFeedback": {"blockReason": "SAFETY"}}))
    error = await fails(make(), PermanentError)
    assert "SAFETY" in str(error)


@pytest.mark.asyncio
async def test_malformed_200_is_transient(fake: FakeLLM, make: MakeProvider) -> None:
    """A 200 whose body is not the expected shape is a TransientError saying "malformed response"."""
    fake.enqueue(malformed())
    error = await fails(make(), TransientError)
    assert "malformed response" in str(error)


@pytest.mark.asyncio
async def test_non_json_200_is_transient(fake: FakeLLM, make: MakeProvider) -> None:
    """A 200 with a body that is not JSON at all is a malformed-response TransientError."""
    fake.enqueue(status(200, body="<html>gateway says hi</html>"))
    error = await fails(make(), TransientError)
    assert "malformed response" in str(error)


@pytest.mark.asyncio
async def test_hang_past_timeout_is_transient_and_quick(fake: FakeLLM, make: MakeProvider) -> None:
    """A server slower than timeout_s gives a TransientError after about timeout_s, not the hang."""
    fake.enqueue(hang(10))
    started = time.monotonic()
    error = await fails(make(timeout_s=0.3), TransientError)
    assert time.monotonic() - started < 2
    assert "0.3s" in str(error)


@pytest.mark.asyncio
async def test_connection_refused_then_recovered(fake: FakeLLM, make: MakeProvider) -> None:
    """A refused connection is a TransientError and probe() False; once the port reopens probe() is True."""
    provider = make()
    await provider.complete(PROMPT)  # a pooled keep-alive connection must not mask the outage
    await fake.set_mode(outage="refuse")
    await fails(provider, TransientError)
    assert await provider.probe() is False
    await fake.set_mode(outage=False)
    assert await provider.probe() is True
    assert (await provider.complete(PROMPT)).text


@pytest.mark.asyncio
async def test_probe_counts_any_http_answer(fake: FakeLLM, make: MakeProvider) -> None:
    """probe() is True whenever an HTTP answer arrives, even during a 503 outage."""
    await fake.set_mode(outage=True)
    provider = make()
    await fails(provider, TransientError)
    assert await provider.probe() is True


@pytest.mark.asyncio
async def test_probe_false_when_nothing_listens(make: MakeProvider) -> None:
    """probe() is False (quickly) when nothing listens at base_url."""
    provider = make(base_url="http://127.0.0.1:9")  # discard port: nothing listens there
    started = time.monotonic()
    assert await provider.probe() is False
    assert time.monotonic() - started < 3


@pytest.mark.asyncio
async def test_key_travels_only_in_its_header(
    fake: FakeLLM, make: MakeProvider, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The key reaches the server in the API's header only: not in the URL, the logs or any error."""
    caplog.set_level(logging.DEBUG)
    provider = make()
    await provider.complete(PROMPT)  # the fake answers 401 unless the key is in the right header
    (seen,) = fake.requests
    assert seen.status == 200
    assert seen.key_present and seen.key_header == AUTH_HEADER[api]
    assert not seen.key_in_url and KEY not in seen.url
    assert KEY not in str(seen.headers)
    for reply, expected in [
        (status(400, body=f"echoing your key {KEY}"), PermanentError),
        (status(401), SystemicError),
        (status(429, retry_after=1), RateLimited),
        (status(503), TransientError),
        (malformed(), TransientError),
        (refusal(), PermanentError),
    ]:
        fake.enqueue(reply)
        await fails(provider, expected)
    fake.enqueue(hang(5))
    await fails(make(timeout_s=0.2), TransientError)
    await fake.set_mode(outage="refuse")
    await fails(provider, TransientError)
    assert KEY not in caplog.text


@pytest.mark.asyncio
async def test_keyless_endpoint_sends_no_key(fake: FakeLLM, make: MakeProvider) -> None:
    """With no api_key_env (vLLM, Ollama) the request carries no auth header at all."""
    fake.api_key = None
    await make(api_key_env=None).complete(PROMPT)
    assert fake.requests[0].key_present is False


@pytest.mark.asyncio
async def test_unset_key_variable_is_systemic_without_a_call(
    fake: FakeLLM, make: MakeProvider, api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider whose key variable is unset fails as SystemicError naming it, before any request."""
    monkeypatch.delenv(ENV[api])
    error = await fails(make(), SystemicError)
    assert ENV[api] in str(error)
    assert fake.requests == []


@pytest.mark.asyncio
async def test_local_provider_is_deterministic_and_offline(fake: FakeLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local provider answers the same prompt with the same text, and never touches the network."""

    async def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the local provider opened a connection")

    monkeypatch.setattr(asyncio.get_running_loop(), "create_connection", no_network)
    provider = build_provider(ProviderConfig(name="local", kind="local", base_url=fake.url))
    assert isinstance(provider, LocalProvider)
    first = await provider.complete(PROMPT)
    second = await provider.complete(Prompt(PROMPT.instruction, PROMPT.system, dict(PROMPT.context)))
    other = await provider.complete(Prompt(PROMPT.instruction, PROMPT.system, {"doc": "xyz"}))
    assert first == second
    assert first.text.startswith("[local:local-echo] Summarise task_id=t-42 please")
    assert other.text != first.text  # the context is part of the answer's identity
    assert first.usage.input_tokens > 0 and first.usage.output_tokens == len(first.text.split())
    assert await provider.probe() is True
    await provider.close()
    assert fake.requests == []


@pytest.mark.asyncio
async def test_local_provider_latency() -> None:
    """config.latency_s delays the local answer, for demos of in-flight work."""
    provider = build_provider(ProviderConfig(kind="local", latency_s=0.2))
    started = time.monotonic()
    await provider.complete(PROMPT)
    assert time.monotonic() - started >= 0.19


def test_anthropic_kind_is_built() -> None:
    """kind="anthropic" builds the Messages client, defaulting to Anthropic's own host."""
    provider = build_provider(ProviderConfig(kind="anthropic", model="claude-x"))
    assert isinstance(provider, AnthropicProvider)
    assert provider.base_url == "https://api.anthropic.com"


def test_unknown_kind_is_a_value_error() -> None:
    """A kind no client serves is refused at build time with the known kinds listed."""
    config = ProviderConfig.model_construct(name="x", kind="cohere", base_url="", model="m")
    with pytest.raises(ValueError, match="anthropic"):
        build_provider(config)


@pytest.mark.asyncio
@pytest.mark.parametrize("api", ["anthropic"])
async def test_anthropic_sends_version_and_omits_empty_system(fake: FakeLLM, make: MakeProvider) -> None:
    """Every Messages call names anthropic-version; a prompt without system text sends no system field."""
    await make().complete(Prompt("No system here"))
    (seen,) = fake.requests
    headers = {k.lower(): v for k, v in seen.headers.items()}
    assert headers["anthropic-version"] == ANTHROPIC_VERSION
    assert "system" not in seen.body
    assert seen.body["messages"] == [{"role": "user", "content": "No system here"}]


@pytest.mark.asyncio
@pytest.mark.parametrize("api", ["anthropic"])
async def test_anthropic_joins_text_blocks_only(fake: FakeLLM, make: MakeProvider) -> None:
    """The answer is the text blocks in order; thinking and tool_use blocks are left out."""
    body = {
        "type": "message",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "text", "text": "first "},
            {"type": "tool_use", "id": "t", "name": "f", "input": {}},
            {"type": "text", "text": "second"},
        ],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 7, "output_tokens": 3},
    }
    fake.enqueue(status(200, body=body))
    completion = await make().complete(PROMPT)
    assert completion.text == "first second"
    assert completion.usage == Usage(input_tokens=7, output_tokens=3)


@pytest.mark.asyncio
@pytest.mark.parametrize("api", ["anthropic"])
@pytest.mark.parametrize(
    "body",
    [
        {"type": "message", "content": [], "stop_reason": "end_turn"},
        {"type": "message", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {"type": "message", "content": "not a list"},
        {"type": "message", "content": [{"type": "text", "text": None}]},
    ],
)
async def test_anthropic_odd_content_is_malformed(fake: FakeLLM, make: MakeProvider, body: dict) -> None:
    """A 200 with no usable text block is a malformed-response TransientError, not an empty answer."""
    fake.enqueue(status(200, body=body))
    error = await fails(make(), TransientError)
    assert "malformed response" in str(error)


@pytest.mark.asyncio
@pytest.mark.parametrize("api", ["anthropic"])
async def test_anthropic_refusal_with_partial_text_is_permanent(fake: FakeLLM, make: MakeProvider) -> None:
    """stop_reason "refusal" wins over any text already streamed into the content: PermanentError."""
    body = {"type": "message", "content": [{"type": "text", "text": "Sure, here"}], "stop_reason": "refusal"}
    fake.enqueue(status(200, body=body))
    error = await fails(make(), PermanentError)
    assert "refusal" in str(error)


@pytest.mark.asyncio
@pytest.mark.parametrize("api", ["anthropic"])
async def test_anthropic_missing_usage_counts_zero(fake: FakeLLM, make: MakeProvider) -> None:
    """An answer without usage still succeeds, with zero tokens rather than an error."""
    fake.enqueue(status(200, body={"type": "message", "content": [{"type": "text", "text": "hi"}]}))
    assert (await make().complete(PROMPT)).usage == Usage()


def test_render_prompt_appends_context_as_json() -> None:
    """The rendered prompt is the instruction, then the context as sorted JSON; no context, no suffix."""
    assert render_prompt(Prompt("Just this")) == "Just this"
    rendered = render_prompt(Prompt("Do it", context={"b": 2, "a": "é"}))
    assert rendered.startswith("Do it\n\nContext (JSON):\n")
    assert rendered.index('"a"') < rendered.index('"b"') and "é" in rendered


@pytest.mark.asyncio
async def test_a_body_over_max_body_bytes_is_result_too_large(fake: FakeLLM, make: MakeProvider) -> None:
    """A body larger than the provider's max_body_bytes is never read whole: the call fails for good
    (ResultTooLarge, a PermanentError), so the task ends failed with result_too_large instead of growing."""
    from agents_stream.contract.errors import ResultTooLarge

    fake.enqueue(ok("x" * 20_000), ok("short"))
    provider = make(max_body_bytes=10_000)
    error = await fails(provider, ResultTooLarge)
    assert isinstance(error, PermanentError) and str(error).startswith("result_too_large: ")
    assert (await provider.complete(PROMPT)).text == "short", "a body within the cap is read as before"


@pytest.mark.asyncio
async def test_a_used_up_script_is_a_permanent_error_saying_so(fake: FakeLLM, make: MakeProvider, api: str) -> None:
    """fake-llm's default ``--exhausted fail``: the worker does not retry it, and the task's error says the
    script ran out instead of the task succeeding on an echo (issue 29 item 4)."""
    fake.exhausted = "fail"
    fake.enqueue(ok("scripted"))
    provider = make()
    assert (await asyncio.wait_for(provider.complete(PROMPT), 10)).text == "scripted"
    error = await fails(provider, PermanentError)
    assert "fake LLM script ran out" in str(error) and "400" in str(error)
