"""The Anthropic Messages client: one ``POST /v1/messages`` per completion, key in the ``x-api-key`` header."""

from __future__ import annotations

import json
import re
from typing import Any

from agents_stream.config import ProviderConfig
from agents_stream.providers.base import Completion, Prompt, TextSink, Usage, render_prompt
from agents_stream.providers.conversation import (
    AssistantTurn,
    Conversation,
    ToolCall,
    ToolResult,
    Turn,
    UserText,
    parse_arguments,
)
from agents_stream.providers.http import HTTPProvider, error_for
from agents_stream.providers.sse import SSEEvent

__all__ = ["ANTHROPIC_VERSION", "AnthropicProvider"]

#: the API version the request and response shapes below are written against
ANTHROPIC_VERSION = "2023-06-01"
_NOT_IN_ID = re.compile(r"[^a-zA-Z0-9_-]")


class AnthropicProvider(HTTPProvider):
    """``POST {base_url}/v1/messages``; like Gemini's, ``base_url`` is the host without the version."""

    default_base_url = "https://api.anthropic.com"

    async def complete(self, prompt: Prompt) -> Completion:
        data = await self._post_json(f"{self.base_url}/v1/messages", self._body(prompt), self._headers())
        text, usage = self._parse(data)
        return Completion(text=text, usage=usage, provider=self.name, model=self.model)

    async def converse(self, conversation: Conversation) -> Turn:
        data = await self._post_json(f"{self.base_url}/v1/messages", self._messages(conversation), self._headers())
        return self._turn(data)

    async def complete_stream(self, prompt: Prompt, on_text: TextSink) -> Completion:
        text, usage = self._parse(await self._streamed(self._body(prompt), on_text))
        return Completion(text=text, usage=usage, provider=self.name, model=self.model)

    async def converse_stream(self, conversation: Conversation, on_text: TextSink) -> Turn:
        return self._turn(await self._streamed(self._messages(conversation), on_text))

    async def _streamed(self, body: dict[str, Any], on_text: TextSink) -> dict[str, Any]:
        """``stream: true``: the events as the message the non-streaming call answers (a gateway that answers whole
        instead: that message, its text given at once)."""
        assembly = MessageStream(on_text, self.config)
        data = await self._post_stream(f"{self.base_url}/v1/messages", {**body, "stream": True}, self._headers(),
                                       assembly)
        if data is None:
            return assembly.body()
        text = "".join(b["text"] for b in self._blocks(data) if b.get("type") == "text" and isinstance(b.get("text"),
                                                                                                       str))
        if text:
            on_text(text)
        return data

    def _turn(self, data: dict[str, Any]) -> Turn:
        blocks = self._blocks(data)
        calls = []
        for block in blocks:
            if block.get("type") != "tool_use":
                continue
            if not isinstance(block.get("name"), str) or not isinstance(block.get("id"), str):
                raise self._malformed("a tool_use block without a name or id")
            arguments, error = parse_arguments(block.get("input"))
            calls.append(ToolCall(block["id"], block["name"], arguments, error))
        texts = [b["text"] for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str)]
        if not texts and not calls:
            raise self._malformed("content without a text or tool_use block")
        return Turn("".join(texts), tuple(calls), _usage(data), self.name, self.model)

    def _headers(self) -> dict[str, str]:
        key = self._key()
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        # a key-less gateway gets no x-api-key at all rather than an empty one
        if key:
            headers["x-api-key"] = key
        return headers

    def _messages(self, conversation: Conversation) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        for m in conversation.messages:
            match m:
                case UserText(text=text):
                    messages.append({"role": "user", "content": text})
                case AssistantTurn(text=text, calls=calls):
                    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
                    blocks += [
                        {"type": "tool_use", "id": _block_id(c.id), "name": c.name, "input": c.arguments} for c in calls
                    ]
                    messages.append({"role": "assistant", "content": blocks})
                case ToolResult(call_id=call_id, content=content, error=error):
                    block = {
                        "type": "tool_result", "tool_use_id": _block_id(call_id), "content": content, "is_error": error,
                    }
                    # the results of one turn's calls go back together, in one user message
                    last = messages[-1] if messages else None
                    if last is not None and last["role"] == "user" and isinstance(last["content"], list):
                        last["content"].append(block)
                    else:
                        messages.append({"role": "user", "content": [block]})
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": conversation.max_tokens or self.config.max_tokens,
            "messages": messages,
        }
        if conversation.system:
            body["system"] = conversation.system
        if conversation.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters}
                for t in conversation.tools
            ]
        return body

    def _probe_url(self) -> str:
        return f"{self.base_url}/v1/models"

    def _body(self, prompt: Prompt) -> dict[str, Any]:
        # max_tokens is required by the Messages API, unlike OpenAI's and Gemini's caps
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": prompt.max_tokens or self.config.max_tokens,
            "messages": [{"role": "user", "content": render_prompt(prompt)}],
        }
        if prompt.system:  # the API rejects an empty system text block, so leave the field out
            body["system"] = prompt.system
        return body

    def _parse(self, data: dict[str, Any]) -> tuple[str, Usage]:
        # thinking and tool_use blocks are not the answer
        texts = [b["text"] for b in self._blocks(data) if b.get("type") == "text" and isinstance(b.get("text"), str)]
        if not texts:
            raise self._malformed("content without a text block")
        return "".join(texts), _usage(data)

    def _blocks(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        """The answer's content blocks; a refusal or a malformed answer raises."""
        if data.get("stop_reason") == "refusal":
            raise self._refused("stop_reason refusal")
        content = data.get("content")
        if not isinstance(content, list):
            raise self._malformed("no content blocks")
        return [block for block in content if isinstance(block, dict)]


#: an ``error`` event's type as the HTTP status the same error has when it comes before the stream
_ERROR_STATUS = {"overloaded_error": 529, "api_error": 500, "rate_limit_error": 429, "timeout_error": 504}


class MessageStream:
    """The Messages API's events (``message_start``, ``content_block_start`` / ``_delta`` / ``_stop``,
    ``message_delta``, ``message_stop``; ``ping``, ``error``) put back together as one message."""

    def __init__(self, on_text: TextSink, config: ProviderConfig) -> None:
        self._on_text = on_text
        self._config = config
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}  # a tool_use block's input, as its partial_json pieces
        self._message: dict[str, Any] = {}
        self._usage: dict[str, Any] = {}
        self._done = False

    def feed(self, event: SSEEvent) -> bool:
        try:
            data = json.loads(event.data)
        except ValueError:
            raise error_for(self._config, status=200, detail="a stream event that is not JSON") from None
        if not isinstance(data, dict):
            raise error_for(self._config, status=200, detail="a stream event that is not a JSON object")
        kind = data.get("type", event.event)
        if kind == "error":
            error: dict[str, Any] = data["error"] if isinstance(data.get("error"), dict) else {}
            detail = " ".join(str(error.get("message", "")).split())[:200]
            raise error_for(self._config, status=_ERROR_STATUS.get(str(error.get("type")), 500), detail=detail)
        if kind == "message_start" and isinstance(data.get("message"), dict):
            self._message = data["message"]
            self._usage.update(self._message.get("usage") or {})
        elif kind == "content_block_start" and isinstance(data.get("content_block"), dict):
            self._blocks[_index(data)] = dict(data["content_block"])
        elif kind == "content_block_delta" and isinstance(data.get("delta"), dict):
            self._delta(_index(data), data["delta"])
        elif kind == "message_delta":
            delta: dict[str, Any] = data["delta"] if isinstance(data.get("delta"), dict) else {}
            self._message = {**self._message, **delta}
            self._usage.update(data.get("usage") or {})
        elif kind == "message_stop":
            self._done = True
            return True
        return False

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self._blocks.setdefault(index, {"type": "text", "text": ""})
        if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
            block["text"] = str(block.get("text") or "") + delta["text"]
            if delta["text"]:
                self._on_text(delta["text"])
        elif delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            self._json.setdefault(index, []).append(delta["partial_json"])

    def complete(self) -> bool:
        return self._done

    def body(self) -> dict[str, Any]:
        blocks = []
        for index, block in sorted(self._blocks.items()):
            pieces = "".join(self._json.get(index, ()))
            if block.get("type") == "tool_use" and pieces:
                try:
                    block = {**block, "input": json.loads(pieces)}
                except ValueError:
                    block = {**block, "input": pieces}  # what it sent: parse_arguments names the error
            blocks.append(block)
        return {**self._message, "content": blocks, "usage": self._usage}


def _index(data: dict[str, Any]) -> int:
    index = data.get("index")
    return index if isinstance(index, int) else 0


def _block_id(call_id: str) -> str:
    """A call id as this API accepts it (letters, digits, _ and -): a conversation begun elsewhere may carry others."""
    return _NOT_IN_ID.sub("_", call_id) or "call"


def _usage(data: dict[str, Any]) -> Usage:
    usage = data.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    return Usage(input_tokens=_count(usage.get("input_tokens")), output_tokens=_count(usage.get("output_tokens")))


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
