"""The fake LLM's wire formats: Gemini, OpenAI chat completions and Anthropic Messages bodies, asked and answered."""

from __future__ import annotations

import json
import random
import time
from typing import Any

from aiohttp import web

from agents_stream.testing.script import Reply

__all__ = ["KEY_HEADERS", "answer_body", "error_body", "model_turns", "prompt_text", "render"]

#: where each API expects its key; the fake checks only there, as the real service would
KEY_HEADERS = {"gemini": "x-goog-api-key", "openai": "authorization", "anthropic": "x-api-key"}


def _texts(content: Any) -> str:
    """Text of a message content: a string, or a list of parts/blocks with ``text``."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = content.get("parts", [])
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def prompt_text(api: str, body: Any) -> tuple[str, str, str]:
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


def model_turns(api: str, body: Any) -> int:
    """How many of the model's own turns a request carries (the turn it asks for, counted from 0)."""
    if not isinstance(body, dict):
        return 0
    if api == "gemini":
        return sum(1 for c in body.get("contents") or [] if isinstance(c, dict) and c.get("role") == "model")
    return sum(1 for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "assistant")


_GEMINI_STATUS = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}  # fmt: skip
_ANTHROPIC_TYPE = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error",
}  # fmt: skip


def error_body(api: str, code: int, message: str) -> dict[str, Any]:
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


def render(api: str, reply: Reply, *, model: str, system: str, instruction: str) -> web.Response:
    """The HTTP answer to a request of ``api`` (its model, system and last user text) for ``reply``."""
    if reply.kind == "status":
        headers = {}
        if reply.retry_after is not None:
            ra = reply.retry_after
            headers["Retry-After"] = f"{ra:g}" if isinstance(ra, int | float) else str(ra)
        body = reply.body
        if body is None:
            body = error_body(api, reply.code, f"fake LLM scripted status {reply.code}")
        if isinstance(body, str):
            return web.Response(status=reply.code, text=body, headers=headers)
        return web.json_response(body, status=reply.code, headers=headers)
    if reply.kind == "malformed":
        return web.json_response({"fake": "malformed", "note": "not the shape of any LLM API"})
    return web.json_response(answer_body(api, reply, model=model, system=system, instruction=instruction))


def answer_body(api: str, reply: Reply, *, model: str, system: str, instruction: str) -> dict[str, Any]:
    """The JSON body of an ``ok`` or ``refusal`` reply (what a streamed answer adds up to as well)."""
    prompt_words = len(f"{system}\n{instruction}".split())
    if reply.kind == "refusal":
        return _refusal_body(api, model, prompt_words)
    text = reply.text if reply.text is not None else f"[fake:{api}] {instruction[:200]}"
    used_in = reply.input_tokens if reply.input_tokens is not None else prompt_words
    used_out = reply.output_tokens if reply.output_tokens is not None else len(text.split())
    body = _ok_body(api, model, text, used_in, used_out)
    if reply.calls:
        _add_calls(api, body, reply)
    return body


def _add_calls(api: str, body: dict[str, Any], reply: Reply) -> None:
    """The scripted tool calls, in the API's own shape (an id the script gave, else one as the API makes them)."""
    text = reply.text or ""
    if api == "gemini":
        parts: list[dict[str, Any]] = [{"text": text}] if text else []
        for c in reply.calls:
            function: dict[str, Any] = {"name": c["name"], "args": c.get("arguments", {})}
            if "id" in c:  # Gemini's ids are optional: none unless the script gives one
                function["id"] = c["id"]
            parts.append({"functionCall": function})
        body["candidates"][0]["content"]["parts"] = parts
    elif api == "anthropic":
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        blocks += [
            {"type": "tool_use", "id": c.get("id", f"toolu_{random.getrandbits(48):012x}"), "name": c["name"],
             "input": c.get("arguments", {})}
            for c in reply.calls
        ]
        body["content"], body["stop_reason"] = blocks, "tool_use"
    else:
        choice = body["choices"][0]
        choice["message"] = {
            "role": "assistant",
            "content": text or None,
            "tool_calls": [
                {"id": c.get("id", f"call_{random.getrandbits(48):012x}"), "type": "function",
                 "function": {"name": c["name"], "arguments": _json_text(c.get("arguments", {}))}}
                for c in reply.calls
            ],
        }
        choice["finish_reason"] = "tool_calls"


def _json_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


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
