"""The fake LLM's script: scripted replies (``ok``, ``status``, ``malformed``, ``hang``, ``refusal``; streamed when
asked: ``chunk_delay``, ``cut_after``) and modes."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

__all__ = [
    "ECHO", "EXHAUSTED", "SCRIPT_RAN_OUT", "Mode", "Reply", "call", "hang", "malformed", "ok", "refusal", "status",
    "tool_calls", "validate_mode",
]

SCRIPT_RAN_OUT = "fake LLM script ran out"
#: what a request gets once a given script is used up (FakeLLM(exhausted=...), fake-llm --exhausted)
EXHAUSTED = ("fail", "echo")


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
    #: tool calls the answer asks for, each {"name", "arguments", optional "id"}, in the API's own format
    calls: tuple[dict[str, Any], ...] = ()
    #: a streamed answer (the client asked for one): seconds between its events
    chunk_delay: float = 0.0
    #: a streamed answer: the connection is cut after this many pieces of its text (None: the stream ends well)
    cut_after: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reply:
        """A reply from JSON (``POST /_admin/script``); unknown fields are an error."""
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown reply fields {sorted(unknown)}; known: {sorted(names)}")
        calls = data.get("calls", ())
        if not isinstance(calls, list | tuple) or not all(isinstance(c, dict) and "name" in c for c in calls):
            raise ValueError('calls must be a list of {"name": ..., "arguments": {...}}')
        reply = cls(**{**data, "calls": tuple(calls)})
        if reply.kind not in {"ok", "status", "malformed", "refusal"}:
            raise ValueError(f"unknown reply kind {reply.kind!r}")
        return reply


def ok(
    text: str | None = None,
    *,
    latency: float = 0.0,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    chunk_delay: float = 0.0,
    cut_after: int | None = None,
) -> Reply:
    """A normal answer; ``text=None`` echoes the prompt, token counts default to word counts. Streamed (when the
    client asks for a stream): ``chunk_delay`` seconds between events, the connection cut after ``cut_after``
    pieces of the text."""
    return Reply("ok", text=text, latency=latency, input_tokens=input_tokens, output_tokens=output_tokens,
                 chunk_delay=chunk_delay, cut_after=cut_after)


def call(name: str, arguments: dict[str, Any] | str | None = None, *, id: str | None = None) -> dict[str, Any]:
    """One tool call of a ``tool_calls`` reply; ``arguments`` a str is sent as is (OpenAI's is a JSON string)."""
    made: dict[str, Any] = {"name": name, "arguments": {} if arguments is None else arguments}
    if id is not None:
        made["id"] = id
    return made


def tool_calls(*calls: dict[str, Any], text: str = "", latency: float = 0.0, chunk_delay: float = 0.0) -> Reply:
    """An answer that asks for tool calls (``call(...)`` each), with optional text, in the API's own format."""
    return Reply("ok", text=text, latency=latency, calls=tuple(calls), chunk_delay=chunk_delay)


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
ECHO = ok()


@dataclass(frozen=True)
class Mode:
    """Behaviour applied to every API request, ahead of the script."""

    outage: bool | str = False  # True: 503 to everything; "refuse": the port refuses connections
    latency: float = 0.0  # seconds added to every answer
    error_rate: float = 0.0  # share of requests answered 500, drawn from the seeded RNG
    rate_limit: float | None = None  # answer 429 with this Retry-After (seconds); None: off
    #: a request that offers tools and carries n model turns gets a call of tool_turns[n] (no arguments); past them,
    #: the script or the default answers: every task an agent loop of len(tool_turns) + 1 turns (benchmarks)
    tool_turns: tuple[str, ...] = ()


def validate_mode(changes: dict[str, Any]) -> dict[str, Any]:
    """Mode changes (``Mode`` fields, ``seed``, ``outage_for``) checked and normalised; ValueError names the field."""
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
    if "tool_turns" in out:
        turns = out["tool_turns"]
        if not isinstance(turns, list | tuple) or not all(isinstance(t, str) and t for t in turns):
            raise ValueError("tool_turns must be a list of tool names")
        out["tool_turns"] = tuple(turns)
    if "seed" in out and not isinstance(out["seed"], int):
        raise ValueError("seed must be an integer")
    return out
