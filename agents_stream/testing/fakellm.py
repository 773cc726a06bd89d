"""A fake LLM server for tests, demos and benchmarks: real HTTP, Gemini/OpenAI/Anthropic shapes, scripted.

    async with FakeLLM([ok("hi"), status(429, retry_after=1)]) as fake:
        ...  # point a provider at fake.url
        assert len(fake.requests) == 2

Scripted replies are consumed in order, then ``default``; with ``default=None``
an exhausted script answers 500 "fake LLM script ran out" and logs an ERROR.
Runtime modes (outage, latency, error_rate, rate_limit) are set with
``set_mode`` in-process or ``POST /_admin/mode`` from another process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import re
import signal
import time
from collections import deque
from collections.abc import Generator, Iterable
from dataclasses import asdict, dataclass, fields, replace
from typing import Any
from urllib.parse import unquote

from aiohttp import web

__all__ = [
    "FakeLLM",
    "Mode",
    "RecordedRequest",
    "Reply",
    "hang",
    "main",
    "malformed",
    "ok",
    "refusal",
    "serve_forever",
    "status",
]

log = logging.getLogger(__name__)

SCRIPT_RAN_OUT = "fake LLM script ran out"
#: where each API expects its key; the fake checks only there, as the real service would
_KEY_HEADERS = {"gemini": "x-goog-api-key", "openai": "authorization", "anthropic": "x-api-key"}
#: headers never recorded: their values are secrets (only their presence is)
_SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-goog-api-key", "x-api-key", "api-key", "cookie"}
)
_TASK_ID = re.compile(r"task_id=([A-Za-z0-9_.:/\-]+)")
#: how long stop() and an outage wait for in-flight answers before cutting them off
_DRAIN_S = 1.0
_START_TIMEOUT_S = 5.0


# -- scripted replies ---------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """One scripted answer; build it with ``ok``, ``status``, ``malformed``, ``hang`` or ``refusal``."""

    kind: str = "ok"  # ok | status | malformed | refusal
    text: str | None = None
    code: int = 200
    retry_after: float | str | None = None
    body: Any = None
    latency: float = 0.0
    input_tokens: int | None = None
    output_tokens: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reply:
        """A reply from JSON (``POST /_admin/script``); unknown fields are an error."""
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown reply fields {sorted(unknown)}; known: {sorted(names)}")
        reply = cls(**data)
        if reply.kind not in {"ok", "status", "malformed", "refusal"}:
            raise ValueError(f"unknown reply kind {reply.kind!r}")
        return reply


def ok(
    text: str | None = None,
    *,
    latency: float = 0.0,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
) -> Reply:
    """A normal answer; ``text=None`` echoes the prompt, token counts default to word counts."""
    return Reply("ok", text=text, latency=latency, input_tokens=input_tokens, output_tokens=output_tokens)


def status(code: int, *, retry_after: float | str | None = None, body: Any = None, latency: float = 0.0) -> Reply:
    """An HTTP status; ``body=None`` gives the API's own error shape, a str or dict is sent as is."""
    return Reply("status", code=code, retry_after=retry_after, body=body, latency=latency)


def malformed(latency: float = 0.0) -> Reply:
    """A 200 whose JSON body is not the shape of any of the APIs."""
    return Reply("malformed", latency=latency)


def hang(seconds: float) -> Reply:
    """Wait ``seconds`` before answering normally: longer than the client's timeout means a timeout."""
    return Reply("ok", latency=seconds)


def refusal(latency: float = 0.0) -> Reply:
    """The API's content-filter answer (Gemini SAFETY, OpenAI content_filter, Anthropic refusal)."""
    return Reply("refusal", latency=latency)


#: the default answer: echo the prompt (a Reply is frozen, so one instance serves all)
_ECHO = ok()


# -- what the fake saw and how it behaves -------------------------------------


@dataclass
class RecordedRequest:
    """One API call as the fake received it; secrets are reduced to "was there a key"."""

    api: str  # gemini | openai | anthropic
    path: str
    url: str  # path and query, with the fake's own api_key (if any) redacted
    model: str
    headers: dict[str, str]
    key_present: bool
    key_header: str | None  # the header the key came in, lower-case
    key_in_url: bool
    body: Any
    instruction: str
    system: str
    task_id: str | None
    ts: float
    status: int | None = None  # what the fake answered, once it has

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Mode:
    """Behaviour applied to every API request, ahead of the script."""

    outage: bool | str = False  # True: 503 to everything; "refuse": the port refuses connections
    latency: float = 0.0  # seconds added to every answer
    error_rate: float = 0.0  # share of requests answered 500, drawn from the seeded RNG
    rate_limit: float | None = None  # answer 429 with this Retry-After (seconds); None: off


def _validated(changes: dict[str, Any]) -> dict[str, Any]:
    """Mode changes checked and normalised; ValueError names the bad field."""
    allowed = {f.name for f in fields(Mode)} | {"seed", "outage_for"}
    unknown = set(changes) - allowed
    if unknown:
        raise ValueError(f"unknown mode fields {sorted(unknown)}; known: {sorted(allowed)}")
    out = dict(changes)
    if "outage" in out and out["outage"] not in (True, False, "refuse"):
        raise ValueError('outage must be true, false or "refuse"')
    for name in ("latency", "outage_for"):
        if out.get(name) is not None and not (isinstance(out[name], int | float) and out[name] >= 0):
            raise ValueError(f"{name} must be a number of seconds >= 0")
    rate = out.get("error_rate", 0)
    if not (isinstance(rate, int | float) and 0 <= rate <= 1):
        raise ValueError("error_rate must be between 0 and 1")
    if "rate_limit" in out:
        value = out["rate_limit"]
        if value is False:
            out["rate_limit"] = None
        elif value is not None and not (isinstance(value, int | float) and value >= 0):
            raise ValueError("rate_limit must be a Retry-After in seconds >= 0, or null for off")
    if "seed" in out and not isinstance(out["seed"], int):
        raise ValueError("seed must be an integer")
    return out


class _Applied:
    """What ``set_mode`` returns: awaiting it waits until the listener matches the new mode."""

    def __init__(self, task: asyncio.Task[None] | None) -> None:
        self._task = task

    def __await__(self) -> Generator[Any, None, None]:
        if self._task is not None:
            yield from asyncio.shield(self._task).__await__()


# -- the server -----------------------------------------------------------------


class FakeLLM:
    """A real aiohttp server on one port speaking Gemini, OpenAI chat completions and Anthropic Messages."""

    def __init__(
        self,
        script: Iterable[Reply] | None = None,
        *,
        default: Reply | None = _ECHO,
        host: str = "127.0.0.1",
        port: int = 0,
        seed: int = 0,
        api_key: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.default = default
        #: when set, requests without this key in the API's header get the API's 401
        self.api_key = api_key
        self.mode = Mode()
        self.requests: list[RecordedRequest] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        #: how many requests found the script empty with no default
        self.script_misses = 0
        self._script: deque[Reply] = deque(script or ())
        self._seed = seed
        self._rng = random.Random(seed)
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._listener_lock = asyncio.Lock()
        self._stopping = asyncio.Event()
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
                web.get("/_admin/mode", self._admin_get_mode),
                web.post("/_admin/mode", self._admin_set_mode),
                web.get("/_admin/requests", self._admin_requests),
                web.get("/_admin/stats", self._admin_stats),
                web.post("/_admin/script", self._admin_script),
                web.post("/_admin/reset", self._admin_reset),
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
        self._stopping.set()  # wakes every sleeping answer
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

    def enqueue(self, *replies: Reply) -> None:
        """Append replies to the script."""
        self._script.extend(replies)

    def set_mode(self, **changes: Any) -> _Applied:
        """Change modes at once: ``outage`` (False/True/"refuse"), ``latency``, ``error_rate``,
        ``rate_limit``, ``seed``, and ``outage_for`` (seconds until the outage ends by itself).

        Await the result when toggling ``outage="refuse"`` to know the port is closed (or open).
        """
        changes = _validated(changes)
        outage_for = changes.pop("outage_for", None)
        if "seed" in changes:
            self._seed = changes.pop("seed")
            self._rng = random.Random(self._seed)
        self.mode = replace(self.mode, **changes)
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
        self.script_misses = 0
        self.peak_in_flight = self.in_flight
        self.set_mode(outage=False, latency=0.0, error_rate=0.0, rate_limit=None, seed=self._seed)

    def stats(self) -> dict[str, Any]:
        return {
            "in_flight": self.in_flight,
            "peak_in_flight": self.peak_in_flight,
            "requests": len(self.requests),
            "script_remaining": len(self._script),
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
        if not target.endswith(":generateContent"):
            raise web.HTTPNotFound(text=f"fake LLM speaks only :generateContent, not {target!r}")
        return await self._api(request, "gemini", model=target.removesuffix(":generateContent"))

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        return await self._api(request, "openai")

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        return await self._api(request, "anthropic")

    async def _api(self, request: web.Request, api: str, model: str = "") -> web.StreamResponse:
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
                reply = status(503, body=_error_body(api, 503, "fake LLM is stopping"))
            response = _render(api, reply, record)
            record.status = response.status
            return response
        finally:
            self.in_flight -= 1

    def _choose(self, record: RecordedRequest, body: Any, key: str | None) -> Reply:
        """Modes first (outage, auth, rate limit, error rate), then the script, then the default."""
        api = record.api
        if self.mode.outage:
            return status(503, body=_error_body(api, 503, "fake LLM outage: the service is unavailable"))
        # the key is checked only in the API's own header, as the real service would
        if self.api_key is not None and (record.key_header != _KEY_HEADERS[api] or key != self.api_key):
            return status(401, body=_error_body(api, 401, "fake LLM: missing or wrong API key"))
        if self.mode.rate_limit is not None:
            return status(429, retry_after=self.mode.rate_limit)
        if self.mode.error_rate and self._rng.random() < self.mode.error_rate:
            return status(500, body=_error_body(api, 500, "fake LLM error_rate struck"))
        if not isinstance(body, dict):
            return status(400, body=_error_body(api, 400, "request body is not a JSON object"))
        if self._script:
            return self._script.popleft()
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
        return status(500, body=_error_body(api, 500, SCRIPT_RAN_OUT))

    def _record(self, request: web.Request, api: str, model: str, body: Any) -> tuple[RecordedRequest, str | None]:
        """Record the request; the key it carried is returned for checking, never stored."""
        key_header, key = None, None
        for name in ("x-goog-api-key", "authorization", "x-api-key"):
            value = request.headers.get(name)
            if value:
                key_header, key = name, value.removeprefix("Bearer ").strip()
                break
        url = unquote(request.path_qs)
        key_in_url = "key" in request.query or bool(self.api_key and self.api_key in url)
        if self.api_key:
            url = url.replace(self.api_key, "<redacted>")
        instruction, system, everything = _prompt_text(api, body)
        found = _TASK_ID.search(instruction) or _TASK_ID.search(everything)
        record = RecordedRequest(
            api=api,
            path=request.path,
            url=url,
            model=model or (str(body.get("model", "")) if isinstance(body, dict) else ""),
            headers={k: v for k, v in request.headers.items() if k.lower() not in _SECRET_HEADERS},
            key_present=key is not None or "key" in request.query,
            key_header=key_header,
            key_in_url=key_in_url,
            body=body,
            instruction=instruction,
            system=system,
            task_id=found.group(1) if found else None,
            ts=time.time(),
        )
        self.requests.append(record)
        return record, key

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    # plain endpoints and admin

    async def _root(self, request: web.Request) -> web.Response:
        return web.json_response({"fake": True})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def _admin_get_mode(self, request: web.Request) -> web.Response:
        return web.json_response({**asdict(self.mode), "seed": self._seed})

    async def _admin_set_mode(self, request: web.Request) -> web.StreamResponse:
        try:
            changes = _validated(await _json_object(request))
        except ValueError as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None
        mode = {**asdict(self.mode), **changes}
        mode.pop("outage_for", None)
        # answer before applying: outage="refuse" closes this very connection
        response = web.json_response(mode)
        await response.prepare(request)
        await response.write_eof()
        self.set_mode(**changes)
        return response

    async def _admin_requests(self, request: web.Request) -> web.Response:
        return web.json_response([r.as_dict() for r in self.requests])

    async def _admin_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def _admin_script(self, request: web.Request) -> web.Response:
        data = await _json_object(request)
        try:
            replies = [Reply.from_dict(r) for r in data.get("replies", [])]
        except (TypeError, ValueError) as exc:
            raise web.HTTPBadRequest(text=f"bad reply: {exc}") from None
        self.enqueue(*replies)
        return web.json_response({"script_remaining": len(self._script)})

    async def _admin_reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"reset": True})


async def _json_object(request: web.Request) -> dict[str, Any]:
    try:
        data = json.loads(await asyncio.wait_for(request.read(), _START_TIMEOUT_S) or b"{}")
    except ValueError:
        raise web.HTTPBadRequest(text="body must be a JSON object") from None
    if not isinstance(data, dict):
        raise web.HTTPBadRequest(text="body must be a JSON object")
    return data


# -- the three API dialects ---------------------------------------------------


def _texts(content: Any) -> str:
    """Text of a message content: a string, or a list of parts/blocks with ``text``."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = content.get("parts", [])
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _prompt_text(api: str, body: Any) -> tuple[str, str, str]:
    """(last user text, system text, all text) of a request in any of the three dialects."""
    if not isinstance(body, dict):
        return "", "", ""
    system, user, everything = "", "", []
    if api == "gemini":
        system = _texts(body.get("systemInstruction"))
        for content in body.get("contents") or []:
            if isinstance(content, dict):
                text = _texts(content)
                everything.append(text)
                if content.get("role", "user") == "user":
                    user = text
    else:
        if api == "anthropic":
            system = _texts(body.get("system"))
        for message in body.get("messages") or []:
            if not isinstance(message, dict):
                continue
            text = _texts(message.get("content"))
            everything.append(text)
            if message.get("role") in ("system", "developer"):
                system = "\n".join(filter(None, [system, text]))
            elif message.get("role") == "user":
                user = text
    return user, system, "\n".join([system, *everything])


_GEMINI_STATUS = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}  # fmt: skip
_ANTHROPIC_TYPE = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error",
}  # fmt: skip


def _error_body(api: str, code: int, message: str) -> dict[str, Any]:
    """An error in the API's own shape."""
    if api == "gemini":
        return {"error": {"code": code, "message": message, "status": _GEMINI_STATUS.get(code, "UNKNOWN")}}
    if api == "anthropic":
        return {
            "type": "error",
            "error": {"type": _ANTHROPIC_TYPE.get(code, "api_error"), "message": message},
        }
    kind = "invalid_request_error" if code < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _render(api: str, reply: Reply, record: RecordedRequest) -> web.Response:
    if reply.kind == "status":
        headers = {}
        if reply.retry_after is not None:
            ra = reply.retry_after
            headers["Retry-After"] = f"{ra:g}" if isinstance(ra, int | float) else str(ra)
        body = reply.body
        if body is None:
            body = _error_body(api, reply.code, f"fake LLM scripted status {reply.code}")
        if isinstance(body, str):
            return web.Response(status=reply.code, text=body, headers=headers)
        return web.json_response(body, status=reply.code, headers=headers)
    if reply.kind == "malformed":
        return web.json_response({"fake": "malformed", "note": "not the shape of any LLM API"})
    prompt_words = len(f"{record.system}\n{record.instruction}".split())
    if reply.kind == "refusal":
        return web.json_response(_refusal_body(api, record.model, prompt_words))
    text = reply.text if reply.text is not None else f"[fake:{api}] {record.instruction[:200]}"
    used_in = reply.input_tokens if reply.input_tokens is not None else prompt_words
    used_out = reply.output_tokens if reply.output_tokens is not None else len(text.split())
    return web.json_response(_ok_body(api, record.model, text, used_in, used_out))


def _ok_body(api: str, model: str, text: str, used_in: int, used_out: int) -> dict[str, Any]:
    if api == "gemini":
        return {
            "candidates": [
                {"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": "STOP", "index": 0}
            ],
            "usageMetadata": {
                "promptTokenCount": used_in,
                "candidatesTokenCount": used_out,
                "totalTokenCount": used_in + used_out,
            },
            "modelVersion": model,
        }
    if api == "anthropic":
        return {
            "id": f"msg_fake_{random.getrandbits(48):012x}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": used_in, "output_tokens": used_out},
        }
    return {
        "id": f"chatcmpl-fake-{random.getrandbits(48):012x}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": used_in,
            "completion_tokens": used_out,
            "total_tokens": used_in + used_out,
        },
    }


def _refusal_body(api: str, model: str, used_in: int) -> dict[str, Any]:
    if api == "gemini":
        return {
            "candidates": [
                {
                    "finishReason": "SAFETY",
                    "index": 0,
                    "safetyRatings": [
                        {
                            "category": "HARM_CATEGORY_DANGEROUS_CONTENT",
                            "probability": "HIGH",
                            "blocked": True,
                        }
                    ],
                }
            ],
            "usageMetadata": {"promptTokenCount": used_in, "totalTokenCount": used_in},
        }
    if api == "anthropic":
        return {
            "id": f"msg_fake_{random.getrandbits(48):012x}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": "refusal",
            "stop_sequence": None,
            "usage": {"input_tokens": used_in, "output_tokens": 0},
        }
    return {
        "id": f"chatcmpl-fake-{random.getrandbits(48):012x}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "refusal": "I can't help with that."},
                "finish_reason": "content_filter",
            }
        ],
        "usage": {"prompt_tokens": used_in, "completion_tokens": 0, "total_tokens": used_in},
    }


# -- command line ---------------------------------------------------------------


async def serve_forever(host: str = "127.0.0.1", port: int = 8089, **mode: Any) -> None:
    """Run a FakeLLM until SIGINT/SIGTERM; ``mode`` takes ``seed`` and the ``set_mode`` fields."""
    seed = mode.pop("seed", 0)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with FakeLLM(host=host, port=port, seed=seed) as fake:
        await fake.set_mode(**mode)
        # the line other processes wait for (and read the port from when --port 0)
        print(f"fake LLM listening on {fake.url}", flush=True)
        await stop.wait()  # the process's whole life: no timeout by design


def main(argv: list[str] | None = None) -> int:
    """``agents-stream fake-llm`` / ``python -m agents_stream.testing.fakellm``."""
    parser = argparse.ArgumentParser(prog="fake-llm", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8089, help="0 picks a free port (printed)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every answer")
    parser.add_argument("--error-rate", type=float, default=0.0, help="share of requests answered 500")
    parser.add_argument("--seed", type=int, default=0, help="seed of the error-rate RNG")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(
            serve_forever(args.host, args.port, latency=args.latency, error_rate=args.error_rate, seed=args.seed)
        )
    except ValueError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
