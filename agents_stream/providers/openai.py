"""The OpenAI-compatible chat-completions client (OpenAI, vLLM, Ollama, LiteLLM proxy)."""

from __future__ import annotations

import json
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

__all__ = ["OpenAIProvider"]


class OpenAIProvider(HTTPProvider):
    """``POST {base_url}/chat/completions``; ``base_url`` includes the version, e.g. ``.../v1``."""

    default_base_url = "https://api.openai.com/v1"

    async def complete(self, prompt: Prompt) -> Completion:
        key = self._key()
        # vLLM and Ollama run without a key: send no Authorization at all rather than an empty one
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        data = await self._post_json(f"{self.base_url}/chat/completions", self._body(prompt), headers)
        text, usage = self._parse(data)
        return Completion(text=text, usage=usage, provider=self.name, model=self.model)

    async def converse(self, conversation: Conversation) -> Turn:
        key = self._key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        data = await self._post_json(f"{self.base_url}/chat/completions", self._chat(conversation), headers)
        message = self._message(data)
        calls = []
        for raw in message.get("tool_calls") or []:
            function = raw.get("function") if isinstance(raw, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise self._malformed("a tool call without a function name")
            arguments, error = parse_arguments(function.get("arguments"))
            call_id = raw["id"] if isinstance(raw.get("id"), str) else ""  # none: the agent loop names it
            calls.append(ToolCall(call_id, function["name"], arguments, error))
        text = _text(message.get("content"))
        if text is None and not calls:
            raise self._malformed("message without text content or tool calls")
        return Turn(text or "", tuple(calls), _usage(data), self.name, self.model)

    def _chat(self, conversation: Conversation) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        if conversation.system:
            messages.append({"role": "system", "content": conversation.system})
        for m in conversation.messages:
            match m:
                case UserText(text=text):
                    messages.append({"role": "user", "content": text})
                case AssistantTurn(text=text, calls=calls):
                    said: dict[str, Any] = {"role": "assistant", "content": text or None}
                    if calls:
                        said["tool_calls"] = [
                            {"id": c.id, "type": "function",
                             "function": {"name": c.name, "arguments": json.dumps(c.arguments, sort_keys=True)}}
                            for c in calls
                        ]
                    messages.append(said)
                case ToolResult(call_id=call_id, content=content):
                    messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": conversation.max_tokens or self.config.max_tokens,
        }
        if conversation.tools:
            body["tools"] = [
                {"type": "function",
                 "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
                for t in conversation.tools
            ]
        return body

    def _probe_url(self) -> str:
        return f"{self.base_url}/models"

    def _body(self, prompt: Prompt) -> dict[str, Any]:
        messages = [{"role": "system", "content": prompt.system}] if prompt.system else []
        messages.append({"role": "user", "content": render_prompt(prompt)})
        # max_tokens, not max_completion_tokens: the compatible servers only know the former
        return {
            "model": self.model,
            "messages": messages,
            "max_tokens": prompt.max_tokens or self.config.max_tokens,
        }

    def _parse(self, data: dict[str, Any]) -> tuple[str, Usage]:
        content = _text(self._message(data).get("content"))
        if content is None:
            raise self._malformed("message without text content")
        return content, _usage(data)

    def _message(self, data: dict[str, Any]) -> dict[str, Any]:
        """The first choice's message; a refusal or a malformed answer raises."""
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise self._malformed("no choices")
        choice = choices[0]
        if choice.get("finish_reason") == "content_filter":
            raise self._refused("finish_reason content_filter")
        message = choice.get("message")
        if not isinstance(message, dict):
            raise self._malformed("choice without a message")
        if isinstance(message.get("refusal"), str) and message["refusal"]:
            raise self._refused(f"the model declined: {message['refusal'][:100]}")
        return message


def _text(content: object) -> str | None:
    if isinstance(content, list):  # some proxies answer in content parts
        content = "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else None


def _usage(data: dict[str, Any]) -> Usage:
    usage = data.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    return Usage(input_tokens=_count(usage.get("prompt_tokens")), output_tokens=_count(usage.get("completion_tokens")))


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
