"""The fake LLM server itself: scripts, loud exhaustion, modes, admin endpoints, concurrency tracking."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

import agents_stream
from agents_stream.testing.fakellm import SCRIPT_RAN_OUT, FakeLLM, malformed, ok, refusal, status

TIMEOUT = aiohttp.ClientTimeout(total=5)
BODIES = {
    "gemini": (
        "/v1beta/models/m:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": "hi task_id=g1"}]}]},
    ),
    "openai": (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi task_id=o1"}]},
    ),
    "anthropic": (
        "/v1/messages",
        {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi task_id=a1"}]},
    ),
}


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    # no keep-alive: outage tests must see each request open its own connection
    async with aiohttp.ClientSession(timeout=TIMEOUT, connector=aiohttp.TCPConnector(force_close=True)) as session:
        yield session


async def call(http: aiohttp.ClientSession, fake: FakeLLM, api: str = "openai") -> tuple[int, Any]:
    path, body = BODIES[api]
    async with http.post(fake.url + path, json=body) as resp:
        return resp.status, await resp.json(content_type=None)


@pytest.mark.asyncio
async def test_script_in_order_then_default(http: aiohttp.ClientSession) -> None:
    """Scripted replies are served in order, then the default answers."""
    async with FakeLLM([status(503), ok("second")], default=ok("fallback")) as fake:
        codes = [await call(http, fake) for _ in range(3)]
    assert [c for c, _ in codes] == [503, 200, 200]
    assert codes[1][1]["choices"][0]["message"]["content"] == "second"
    assert codes[2][1]["choices"][0]["message"]["content"] == "fallback"
    assert [r.status for r in fake.requests] == [503, 200, 200]


@pytest.mark.asyncio
async def test_script_running_out_is_loud(http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture) -> None:
    """With no default, an exhausted script answers 500 "fake LLM script ran out" and logs an ERROR."""
    async with FakeLLM([ok("only")], default=None) as fake:
        assert (await call(http, fake))[0] == 200
        code, body = await call(http, fake)
    assert code == 500
    assert SCRIPT_RAN_OUT in str(body)
    assert fake.script_misses == 1
    assert any(r.levelno == logging.ERROR and SCRIPT_RAN_OUT.upper() in r.getMessage() for r in caplog.records)


@pytest.mark.asyncio
@pytest.mark.parametrize("api", ["gemini", "openai", "anthropic"])
async def test_each_api_answers_in_its_own_shape(http: aiohttp.ClientSession, api: str) -> None:
    """ok, refusal and error answers follow each API's documented response shape."""
    async with FakeLLM([ok("hey", input_tokens=4, output_tokens=1), refusal(), status(429, retry_after=2)]) as fake:
        _, good = await call(http, fake, api)
        _, refused = await call(http, fake, api)
        code, error = await call(http, fake, api)
    assert code == 429 and "error" in error
    if api == "gemini":
        assert good["candidates"][0]["content"]["parts"][0]["text"] == "hey"
        assert good["usageMetadata"]["promptTokenCount"] == 4
        assert refused["candidates"][0]["finishReason"] == "SAFETY"
    elif api == "openai":
        assert good["choices"][0]["message"]["content"] == "hey"
        assert good["usage"]["completion_tokens"] == 1
        assert refused["choices"][0]["finish_reason"] == "content_filter"
    else:
        assert good["content"][0] == {"type": "text", "text": "hey"}
        assert good["usage"] == {"input_tokens": 4, "output_tokens": 1}
        assert refused["stop_reason"] == "refusal"
        assert error["type"] == "error"
    assert fake.requests[0].api == api and fake.requests[0].task_id == f"{api[0]}1"


@pytest.mark.asyncio
async def test_recorded_requests_hide_key_values(http: aiohttp.ClientSession) -> None:
    """Requests are recorded with headers but without auth values: only whether a key came, and where."""
    async with FakeLLM(api_key="sk-hidden") as fake:
        path, body = BODIES["anthropic"]
        async with http.post(fake.url + path, json=body, headers={"x-api-key": "sk-hidden"}) as resp:
            assert resp.status == 200
        async with http.post(fake.url + path, json=body) as resp:
            assert resp.status == 401  # the real API's answer to a missing key
    seen = fake.requests[0]
    assert seen.key_present and seen.key_header == "x-api-key"
    assert "sk-hidden" not in str(seen.as_dict())
    assert not fake.requests[1].key_present


@pytest.mark.asyncio
async def test_admin_endpoints(http: aiohttp.ClientSession) -> None:
    """Another process can read requests, set modes, queue a script and reset, all over HTTP."""
    async with FakeLLM() as fake:
        async with http.get(fake.url + "/") as resp:
            assert resp.status == 200 and await resp.json() == {"fake": True}
        async with http.get(fake.url + "/v1/models") as resp:
            assert resp.status == 200
        await call(http, fake, "gemini")
        async with http.get(fake.url + "/_admin/requests") as resp:
            (recorded,) = await resp.json()
        assert recorded["task_id"] == "g1" and recorded["api"] == "gemini" and recorded["status"] == 200

        async with http.post(fake.url + "/_admin/mode", json={"outage": True}) as resp:
            assert resp.status == 200 and (await resp.json())["outage"] is True
        assert (await call(http, fake))[0] == 503
        async with http.post(fake.url + "/_admin/mode", json={"outage": False, "rate_limit": 7}) as resp:
            assert resp.status == 200
        async with http.post(fake.url + BODIES["openai"][0], json=BODIES["openai"][1]) as resp:
            assert resp.status == 429 and resp.headers["Retry-After"] == "7"
        async with http.post(fake.url + "/_admin/mode", json={"error_rate": 2}) as resp:
            assert resp.status == 400  # a bad mode is refused, not half-applied
        async with http.post(fake.url + "/_admin/script", json={"replies": [{"kind": "malformed"}]}) as resp:
            assert resp.status == 200

        async with http.post(fake.url + "/_admin/reset") as resp:
            assert resp.status == 200
        assert fake.requests == [] and fake.mode.rate_limit is None
        async with http.get(fake.url + "/_admin/stats") as resp:
            assert (await resp.json())["script_remaining"] == 0
        assert (await call(http, fake))[0] == 200


@pytest.mark.asyncio
async def test_error_rate_is_deterministic_with_a_seed(http: aiohttp.ClientSession) -> None:
    """The same seed and error_rate fail the same requests; another seed fails others."""

    async def pattern(seed: int) -> list[int]:
        async with FakeLLM(seed=seed) as fake:
            fake.set_mode(error_rate=0.5)
            return [(await call(http, fake))[0] for _ in range(24)]

    first, again, other = await pattern(7), await pattern(7), await pattern(8)
    assert first == again
    assert set(first) == {200, 500}
    assert other != first


@pytest.mark.asyncio
async def test_peak_in_flight(http: aiohttp.ClientSession) -> None:
    """in_flight counts answers being worked on; peak_in_flight keeps the highest count seen."""
    async with FakeLLM(default=ok(latency=0.3)) as fake:
        await asyncio.gather(*(call(http, fake) for _ in range(6)))
        assert fake.peak_in_flight == 6
        assert fake.in_flight == 0


@pytest.mark.asyncio
async def test_latency_mode_slows_every_answer(http: aiohttp.ClientSession) -> None:
    """The latency mode adds its delay to every API answer."""
    async with FakeLLM() as fake:
        fake.set_mode(latency=0.25)
        started = time.monotonic()
        await call(http, fake)
        assert time.monotonic() - started >= 0.24


@pytest.mark.asyncio
async def test_refuse_outage_closes_and_reopens_the_same_port(http: aiohttp.ClientSession) -> None:
    """outage="refuse" makes connections fail; turning it off reopens the same port."""
    async with FakeLLM() as fake:
        url = fake.url
        await fake.set_mode(outage="refuse")
        with pytest.raises(aiohttp.ClientConnectionError):
            await call(http, fake)
        await fake.set_mode(outage=False)
        assert fake.url == url
        assert (await call(http, fake))[0] == 200


@pytest.mark.asyncio
async def test_refuse_outage_over_http_ends_by_itself(http: aiohttp.ClientSession) -> None:
    """A refusing outage set over HTTP with outage_for ends by itself, since the admin port is closed too."""
    async with FakeLLM() as fake:
        async with http.post(fake.url + "/_admin/mode", json={"outage": "refuse", "outage_for": 0.4}) as resp:
            assert resp.status == 200
        await asyncio.sleep(0.1)
        with pytest.raises(aiohttp.ClientConnectionError):
            await call(http, fake)
        await asyncio.sleep(0.6)
        assert (await call(http, fake))[0] == 200


@pytest.mark.asyncio
async def test_stop_does_not_wait_for_hung_answers(http: aiohttp.ClientSession) -> None:
    """stop() returns promptly even while a scripted hang is sleeping."""
    fake = await FakeLLM(default=ok(latency=30)).start()
    pending = asyncio.ensure_future(call(http, fake))
    await asyncio.sleep(0.1)
    started = time.monotonic()
    await fake.stop()
    assert time.monotonic() - started < 3
    code, _ = await asyncio.wait_for(pending, 5)
    assert code == 503


@pytest.mark.asyncio
async def test_malformed_is_200_with_a_foreign_shape(http: aiohttp.ClientSession) -> None:
    """malformed() answers 200 with JSON that is no API's response shape."""
    async with FakeLLM([malformed()]) as fake:
        code, body = await call(http, fake, "gemini")
    assert code == 200 and "candidates" not in body and "choices" not in body


@pytest.mark.asyncio
async def test_cli_serves_on_the_printed_port(http: aiohttp.ClientSession) -> None:
    """`python -m agents_stream.testing.fakellm --port 0` prints its URL and answers there."""
    # the child must import this very checkout, installed or not
    root = str(Path(agents_stream.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agents_stream.testing.fakellm", "--port", "0", "--latency", "0.01",
        stdout=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 15)).decode()  # type: ignore[union-attr]
        url = line.strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://127.0.0.1:")
        async with http.get(url + "/_admin/mode") as resp:
            assert (await resp.json())["latency"] == 0.01
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 10) == 0


@pytest.mark.asyncio
async def test_a_used_up_script_fails_loudly_with_exhausted_fail(
    http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture,
) -> None:
    """fake-llm's default: echo until given a script; once that script is used up, a 400 naming it and an ERROR
    line, not an echo; ``replace`` drops the replies left; a reset starts over (docs/guide/fake-llm.md)."""
    async with FakeLLM(exhausted="fail") as fake:
        code, body = await call(http, fake)
        assert code == 200 and "hi task_id=o1" in body["choices"][0]["message"]["content"]  # never scripted: echo
        async with http.post(fake.url + "/_admin/script", json={"replies": [{"text": "a"}, {"text": "b"}]}) as resp:
            assert (await resp.json())["script_remaining"] == 2
        async with http.post(fake.url + "/_admin/script",
                             json={"replies": [{"text": "c"}], "replace": True}) as resp:
            assert (await resp.json())["script_remaining"] == 1
        code, body = await call(http, fake)
        assert code == 200 and body["choices"][0]["message"]["content"] == "c"
        code, body = await call(http, fake)
        assert code == 400 and SCRIPT_RAN_OUT in str(body) and "3 scripted replies" in str(body)
        assert any(r.levelno == logging.ERROR and SCRIPT_RAN_OUT.upper() in r.getMessage() for r in caplog.records)
        async with http.post(fake.url + "/_admin/script", json={"replis": []}) as resp:
            assert resp.status == 400
        async with http.post(fake.url + "/_admin/reset") as resp:
            assert resp.status == 200
        assert (await call(http, fake))[0] == 200  # reset: never scripted again
    with pytest.raises(ValueError, match="exhausted"):
        FakeLLM(exhausted="loop")
