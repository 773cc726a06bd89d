"""The fake LLM's server: a real aiohttp server speaking the three APIs; its admin endpoints are in fakellm_admin.py."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import random
from collections import deque
from collections.abc import Callable, Generator, Iterable
from typing import Any

from aiohttp import web

from agents_stream.testing.fakellm_admin import admin_routes
from agents_stream.testing.recorded import RecordedRequest, record_request
from agents_stream.testing.script import (
    ECHO,
    EXHAUSTED,
    SCRIPT_RAN_OUT,
    Mode,
    Reply,
    call,
    status,
    tool_calls,
    validate_mode,
)
from agents_stream.testing.wire import KEY_HEADERS, answer_body, error_body, model_turns, render
from agents_stream.testing.wire_stream import StreamEvent, stream_events, wants_stream

__all__ = ["FakeLLM", "RecordedRequest"]

# The public entry's name, as before the split: a logging config that names it keeps working.
log = logging.getLogger("agents_stream.testing.fakellm")

#: how long stop() and an outage wait for in-flight answers before cutting them off
_DRAIN_S = 1.0
_START_TIMEOUT_S = 5.0


class _Applied:
    """What ``set_mode`` returns: awaiting it waits until the listener matches the new mode."""

    def __init__(self, task: asyncio.Task[None] | None) -> None:
        self._task = task

    def __await__(self) -> Generator[Any, None, None]:
        if self._task is not None:
            yield from asyncio.shield(self._task).__await__()


class FakeLLM:
    """A real aiohttp server on one port speaking Gemini, OpenAI chat completions and Anthropic Messages."""

    def __init__(
        self,
        script: Iterable[Reply] | None = None,
        *,
        default: Reply | None = ECHO,
        host: str = "127.0.0.1",
        port: int = 0,
        seed: int = 0,
        api_key: str | None = None,
        responder: Callable[[RecordedRequest, int], Reply | None] | None = None,
        exhausted: str = "echo",
    ) -> None:
        if exhausted not in EXHAUSTED:
            raise ValueError(f"exhausted must be one of {EXHAUSTED}, not {exhausted!r}")
        self.host = host
        self.port = port
        self.default = default
        #: a request that finds a given script used up: "echo" (the default answers, as before any script) or
        #: "fail" (a 400 naming SCRIPT_RAN_OUT, which the worker reports as the task's error)
        self.exhausted = exhausted
        #: when set, requests without this key in the API's header get the API's 401
        self.api_key = api_key
        #: asked after the modes, before the script: (the request, the turn it asks for) → a reply, or None for the
        #: script's; answers each task by its own conversation when tasks run at once on several workers
        self.responder = responder
        self.mode = Mode()
        self.requests: list[RecordedRequest] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        #: how many requests found the script empty with no default
        self.script_misses = 0
        self._script: deque[Reply] = deque(script or ())
        #: how many replies were scripted since the start or the last reset
        self.scripted = len(self._script)
        self._seed = seed
        self._rng = random.Random(seed)
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._listener_lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        #: set by ``release_held`` and by the stop: the answers waiting out their latency then go out at once
        self._release = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._outage_timer: asyncio.Task[None] | None = None

    # lifecycle

    @property
    def url(self) -> str:
        """``http://host:port``; the port is known once started."""
        if not self.port:
            raise RuntimeError("FakeLLM has no port yet: await start() first")
        return f"http://{self.host}:{self.port}"

    async def start(self) -> FakeLLM:
        app = web.Application()
        app.add_routes(
            [
                web.get("/", self._root),
                web.get("/v1/models", self._models),
                web.get("/models", self._models),
                web.post("/v1beta/models/{target}", self._gemini),
                web.post("/v1/models/{target}", self._gemini),
                web.post("/v1/chat/completions", self._openai),
                web.post("/chat/completions", self._openai),
                web.post("/v1/messages", self._anthropic),
                *admin_routes(self),
            ]
        )
        # a short shutdown_timeout: a hung scripted answer must not hold stop() for a minute
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=_DRAIN_S)
        self._stopping.clear()
        await asyncio.wait_for(self._runner.setup(), _START_TIMEOUT_S)
        await self._open()  # even in "refuse" mode: a port=0 fake needs a port first
        await self._sync_listener()
        log.info("fake LLM listening on %s", self.url)
        return self

    async def stop(self) -> None:
        self._stopping.set()
        self._release.set()  # wakes every sleeping answer, and those asked from now on do not sleep
        self._outage_timer = None
        tasks, self._tasks = list(self._tasks), set()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_DRAIN_S)
        runner, self._runner, self._site = self._runner, None, None
        if runner is not None:
            await asyncio.wait_for(runner.cleanup(), _DRAIN_S * 3)

    async def __aenter__(self) -> FakeLLM:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # control from the test process

    @property
    def seed(self) -> int:
        """The seed of the error_rate's RNG (``set_mode(seed=...)`` changes it)."""
        return self._seed

    def enqueue(self, *replies: Reply, replace: bool = False) -> None:
        """Append replies to the script; ``replace`` drops the replies left first."""
        if replace:
            self._script.clear()
        self._script.extend(replies)
        self.scripted += len(replies)

    def set_mode(self, **changes: Any) -> _Applied:
        """Change modes at once: ``outage`` (False/True/"refuse"), ``latency``, ``error_rate``,
        ``rate_limit``, ``seed``, and ``outage_for`` (seconds until the outage ends by itself).

        Await the result when toggling ``outage="refuse"`` to know the port is closed (or open).
        """
        changes = validate_mode(changes)
        outage_for = changes.pop("outage_for", None)
        if "seed" in changes:
            self._seed = changes.pop("seed")
            self._rng = random.Random(self._seed)
        self.mode = dataclasses.replace(self.mode, **changes)
        if "outage" in changes and self._outage_timer is not None:
            self._outage_timer.cancel()
            self._outage_timer = None
        if self._runner is None:
            return _Applied(None)
        if outage_for is not None and self.mode.outage:
            self._outage_timer = self._spawn(self._end_outage_after(outage_for))
        listening = self._site is not None
        if listening == (self.mode.outage != "refuse"):
            return _Applied(None)
        return _Applied(self._spawn(self._sync_listener()))

    def reset(self) -> None:
        """Forget requests, script, modes and peaks; reseed the RNG. The listener reopens if closed."""
        self.requests.clear()
        self._script.clear()
        self.scripted = 0
        self.script_misses = 0
        self.peak_in_flight = self.in_flight
        self.set_mode(outage=False, latency=0.0, error_rate=0.0, rate_limit=None, tool_turns=(), seed=self._seed)

    def stats(self) -> dict[str, Any]:
        return {
            "in_flight": self.in_flight,
            "peak_in_flight": self.peak_in_flight,
            "requests": len(self.requests),
            "script_remaining": len(self._script),
            "scripted": self.scripted,
            "script_misses": self.script_misses,
        }

    # listener management (outage="refuse")

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        # owned: stop() cancels and awaits whatever is still running
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _end_outage_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self._outage_timer = None
        await self.set_mode(outage=False)

    async def _open(self) -> None:
        assert self._runner is not None
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await asyncio.wait_for(site.start(), _START_TIMEOUT_S)
        self._site = site
        if not self.port:
            self.port = self._runner.addresses[0][1]

    async def _sync_listener(self) -> None:
        async with self._listener_lock:
            if self._runner is None:
                return
            refuse = self.mode.outage == "refuse"
            if refuse and self._site is not None:
                site, self._site = self._site, None
                await site.stop()
                # keep-alive connections would still reach us; a dead server has none
                for conn in self._runner.server.connections if self._runner.server else ():
                    conn.force_close()
                log.warning("fake LLM: outage=refuse, %s now refuses connections", self.url)
            elif not refuse and self._site is None:
                await self._open()
                log.warning("fake LLM: listening again on %s", self.url)

    # the APIs

    async def _gemini(self, request: web.Request) -> web.StreamResponse:
        target = request.match_info["target"]
        model, _, method = target.rpartition(":")
        if method not in ("generateContent", "streamGenerateContent"):
            raise web.HTTPNotFound(text=f"fake LLM speaks only :generateContent and :streamGenerateContent, not "
                                        f"{target!r}")
        return await self._api(request, "gemini", model=model, target=target)

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        return await self._api(request, "openai")

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        return await self._api(request, "anthropic")

    async def _api(self, request: web.Request, api: str, model: str = "", target: str = "") -> web.StreamResponse:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            raw = await asyncio.wait_for(request.read(), _START_TIMEOUT_S)
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            record, key = self._record(request, api, model, body)
            reply = self._choose(record, body, key)
            delay = self.mode.latency + reply.latency
            if delay > 0:
                await self._sleep(delay)
            if self._stopping.is_set():
                reply = status(503, body=error_body(api, 503, "fake LLM is stopping"))
            if reply.kind in ("ok", "refusal") and wants_stream(api, target, body):
                record.status = 200
                answer = answer_body(api, reply, model=record.model, system=record.system,
                                     instruction=record.instruction)
                return await self._stream(request, stream_events(api, answer, body), reply)
            response = render(api, reply, model=record.model, system=record.system, instruction=record.instruction)
            record.status = response.status
            return response
        finally:
            self.in_flight -= 1

    async def _stream(self, request: web.Request, events: list[StreamEvent], reply: Reply) -> web.StreamResponse:
        """A streamed answer, an event at a time (``chunk_delay`` apart); cut after ``cut_after`` text pieces."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        said = 0
        for name, data, text in events:
            if reply.cut_after is not None and text and said >= reply.cut_after:
                log.info("fake LLM: the stream is cut after %d pieces of text (cut_after)", said)
                if request.transport is not None:
                    request.transport.close()  # no last chunk: the client sees the body end early
                return response
            said += text
            await response.write((f"event: {name}\n" if name else "").encode() + f"data: {data}\n\n".encode())
            if reply.chunk_delay > 0:
                await self._sleep(reply.chunk_delay)
        await response.write_eof()
        return response

    def _choose(self, record: RecordedRequest, body: Any, key: str | None) -> Reply:
        """Modes first (outage, auth, rate limit, error rate), then the responder, the script, the default."""
        api = record.api
        if self.mode.outage:
            return status(503, body=error_body(api, 503, "fake LLM outage: the service is unavailable"))
        # the key is checked only in the API's own header, as the real service would
        if self.api_key is not None and (record.key_header != KEY_HEADERS[api] or key != self.api_key):
            return status(401, body=error_body(api, 401, "fake LLM: missing or wrong API key"))
        if self.mode.rate_limit is not None:
            return status(429, retry_after=self.mode.rate_limit)
        if self.mode.error_rate and self._rng.random() < self.mode.error_rate:
            return status(500, body=error_body(api, 500, "fake LLM error_rate struck"))
        if not isinstance(body, dict):
            return status(400, body=error_body(api, 400, "request body is not a JSON object"))
        turns = self.mode.tool_turns
        if turns and body.get("tools"):
            n = model_turns(api, body)
            if n < len(turns):
                return tool_calls(call(turns[n]))
        if self.responder is not None:
            chosen = self.responder(record, model_turns(api, body))
            if chosen is not None:
                return chosen
        if self._script:
            return self._script.popleft()
        if self.exhausted == "fail" and self.scripted:
            self.script_misses += 1
            log.error("%s: %s request #%d (task_id=%s) got a 400; all %d scripted replies are used",
                      SCRIPT_RAN_OUT.upper(), api, len(self.requests), record.task_id, self.scripted)
            return status(400, body=error_body(api, 400, (
                f"{SCRIPT_RAN_OUT}: all {self.scripted} scripted replies are used; POST more to /_admin/script, "
                "or start fake-llm with --exhausted echo")))
        if self.default is not None:
            return self.default
        self.script_misses += 1
        log.error(
            "%s: %s request #%d (task_id=%s) got a 500; give the FakeLLM a longer script or a default",
            SCRIPT_RAN_OUT.upper(),
            api,
            len(self.requests),
            record.task_id,
        )
        return status(500, body=error_body(api, 500, SCRIPT_RAN_OUT))

    def _record(self, request: web.Request, api: str, model: str, body: Any) -> tuple[RecordedRequest, str | None]:
        """Record the request; the key it carried is returned for checking, never stored."""
        record, key = record_request(request, api, model, body, self.api_key)
        self.requests.append(record)
        return record, key

    async def _sleep(self, seconds: float) -> None:
        released = self._release  # the release of answers held now (or the stop), not of answers asked later
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(released.wait(), seconds)

    def release_held(self) -> None:
        """Every answer now waiting out its latency goes out at once; answers asked later wait out theirs. A test
        holds an answer (a long latency) until the moment it wants it to arrive."""
        self._release.set()
        if not self._stopping.is_set():
            self._release = asyncio.Event()

    # plain endpoints

    async def _root(self, request: web.Request) -> web.Response:
        return web.json_response({"fake": True})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
