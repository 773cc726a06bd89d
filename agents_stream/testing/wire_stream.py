"""The fake LLM's streamed answers: a body of wire.py cut into the events of each API's streaming format.

A streamed answer is made from the very body the non-streaming call gets (``answer_body``), so a client that puts
the stream back together must arrive at that body: OpenAI chat-completion chunks (``delta.content``, tool-call
pieces by index, a usage chunk, ``[DONE]``), Anthropic Messages events (``message_start`` … ``message_stop``) and
Gemini partial GenerateContentResponses (``alt=sse``). The text goes a few words an event.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["StreamEvent", "pieces", "stream_events", "wants_stream"]

#: (the SSE event name, or None; its data; whether it carries a piece of the answer's text)
StreamEvent = tuple[str | None, str, bool]

_PIECE = re.compile(r"\s*\S+\s*|\s+")


def wants_stream(api: str, target: str, body: Any) -> bool:
    """Whether a request asks for a streamed answer (Gemini by its method, the others by ``stream: true``)."""
    if api == "gemini":
        return target.endswith(":streamGenerateContent")
    return isinstance(body, dict) and body.get("stream") is True


def pieces(text: str, words: int = 2) -> list[str]:
    """The text a few words at a time (joined, the text again)."""
    found = _PIECE.findall(text)
    return ["".join(found[i:i + words]) for i in range(0, len(found), words)]


def stream_events(api: str, body: dict[str, Any], request: Any) -> list[StreamEvent]:
    """The events that add up to ``body`` (``request``: the request's body, for OpenAI's ``stream_options``)."""
    if api == "gemini":
        return _gemini(body)
    if api == "anthropic":
        return _anthropic(body)
    usage = isinstance(request, dict) and (request.get("stream_options") or {}).get("include_usage") is True
    return _openai(body, usage)


def _data(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _openai(body: dict[str, Any], with_usage: bool) -> list[StreamEvent]:
    head: dict[str, Any] = {k: body[k] for k in ("id", "created", "model") if k in body}
    head["object"] = "chat.completion.chunk"
    choice = body["choices"][0]
    message = choice.get("message") or {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return _data({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    events: list[StreamEvent] = [(None, chunk({"role": "assistant", "content": ""}), False)]
    for piece in pieces(message.get("content") or ""):
        events.append((None, chunk({"content": piece}), True))
    if message.get("refusal"):
        events.append((None, chunk({"refusal": message["refusal"]}), False))
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        start = {"index": i, "id": call["id"], "type": "function", "function": {"name": function["name"],
                                                                                "arguments": ""}}
        events.append((None, chunk({"tool_calls": [start]}), False))
        arguments = function["arguments"]
        for part in (arguments[:len(arguments) // 2], arguments[len(arguments) // 2:]):
            events.append((None, chunk({"tool_calls": [{"index": i, "function": {"arguments": part}}]}), False))
    events.append((None, chunk({}, choice.get("finish_reason")), False))
    if with_usage and "usage" in body:
        events.append((None, _data({**head, "choices": [], "usage": body["usage"]}), False))
    events.append((None, "[DONE]", False))
    return events


def _anthropic(body: dict[str, Any]) -> list[StreamEvent]:
    usage = body.get("usage") or {}
    start = {**{k: v for k, v in body.items() if k not in ("content", "usage")}, "content": [],
             "stop_reason": None, "usage": {"input_tokens": usage.get("input_tokens", 0), "output_tokens": 1}}
    events: list[StreamEvent] = [("message_start", _data({"type": "message_start", "message": start}), False)]
    events.append(("ping", _data({"type": "ping"}), False))
    for index, block in enumerate(body.get("content") or []):
        if block.get("type") == "tool_use":
            opened = {**block, "input": {}}
            arguments = json.dumps(block.get("input", {}))
            deltas = [({"type": "input_json_delta", "partial_json": part}, False)
                      for part in (arguments[:len(arguments) // 2], arguments[len(arguments) // 2:])]
        else:
            opened = {"type": "text", "text": ""}
            deltas = [({"type": "text_delta", "text": piece}, True) for piece in pieces(block.get("text") or "")]
        events.append(("content_block_start", _data({"type": "content_block_start", "index": index,
                                                     "content_block": opened}), False))
        for delta, text in deltas:
            events.append(("content_block_delta", _data({"type": "content_block_delta", "index": index,
                                                         "delta": delta}), text))
        events.append(("content_block_stop", _data({"type": "content_block_stop", "index": index}), False))
    stop = {"stop_reason": body.get("stop_reason"), "stop_sequence": body.get("stop_sequence")}
    events.append(("message_delta", _data({"type": "message_delta", "delta": stop,
                                           "usage": {"output_tokens": usage.get("output_tokens", 0)}}), False))
    events.append(("message_stop", _data({"type": "message_stop"}), False))
    return events


def _gemini(body: dict[str, Any]) -> list[StreamEvent]:
    candidate = body["candidates"][0]
    parts = (candidate.get("content") or {}).get("parts")
    if parts is None:  # a refusal: one response, as the API streams it
        return [(None, _data(body), False)]
    head = {k: v for k, v in body.items() if k not in ("candidates", "usageMetadata")}
    events: list[StreamEvent] = []
    for part in parts:
        split = pieces(part["text"]) if isinstance(part.get("text"), str) and part["text"] else [None]
        for piece in split:
            one = part if piece is None else {**part, "text": piece}
            chunk = {**head, "candidates": [{"content": {"role": "model", "parts": [one]}, "index": 0}]}
            events.append((None, _data(chunk), piece is not None))
    last = {**head, "candidates": [{"content": {"role": "model", "parts": []}, "index": 0,
                                    "finishReason": candidate.get("finishReason")}],
            "usageMetadata": body.get("usageMetadata")}
    events.append((None, _data(last), False))
    return events
