"""The Anthropic Messages client: one ``POST /v1/messages`` per completion, key in the ``x-api-key`` header."""

from __future__ import annotations

import re
from typing import Any

from agents_stream.providers.base import Completion, Prompt, Usage, render_prompt
from agents_stream.providers.conversation import (
    AssistantTurn,
    Conversation,
    ToolCall,
    ToolResult,
    Turn,
    UserText,
    parse_arguments,
)
from agents_stream.providers.http import HTTPProvider

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


def _block_id(call_id: str) -> str:
    """A call id as this API accepts it (letters, digits, _ and -): a conversation begun elsewhere may carry others."""
    return _NOT_IN_ID.sub("_", call_id) or "call"


def _usage(data: dict[str, Any]) -> Usage:
    usage = data.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    return Usage(input_tokens=_count(usage.get("input_tokens")), output_tokens=_count(usage.get("output_tokens")))


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
