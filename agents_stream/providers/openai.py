"""The OpenAI-compatible chat-completions client (OpenAI, vLLM, Ollama, LiteLLM proxy)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from agents_stream.contract.errors import PermanentError, TaskError
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
from agents_stream.providers.http import HTTPProvider
from agents_stream.providers.sse import SSEEvent

__all__ = ["OpenAIProvider"]

log = logging.getLogger(__name__)


class OpenAIProvider(HTTPProvider):
    """``POST {base_url}/chat/completions``; ``base_url`` includes the version, e.g. ``.../v1``."""

    default_base_url = "https://api.openai.com/v1"
    #: the server refused a streamed request (it knows no ``stream_options``): ask it whole
    _unstreamed = False

    async def complete(self, prompt: Prompt) -> Completion:
        data = await self._post_json(f"{self.base_url}/chat/completions", self._body(prompt), self._headers())
        text, usage = self._parse(data)
        return Completion(text=text, usage=usage, provider=self.name, model=self.model)

    async def converse(self, conversation: Conversation) -> Turn:
        data = await self._post_json(f"{self.base_url}/chat/completions", self._chat(conversation), self._headers())
        return self._turn(data)

    async def complete_stream(self, prompt: Prompt, on_text: TextSink) -> Completion:
        data = await self._streamed(self._body(prompt), on_text)
        text, usage = self._parse(data)
        return Completion(text=text, usage=usage, provider=self.name, model=self.model)

    async def converse_stream(self, conversation: Conversation, on_text: TextSink) -> Turn:
        return self._turn(await self._streamed(self._chat(conversation), on_text))

    async def _streamed(self, body: dict[str, Any], on_text: TextSink) -> dict[str, Any]:
        """``stream: true``: the chunks' deltas as the body the non-streaming call answers (a gateway that answers
        whole instead: that body, its text given at once)."""
        url = f"{self.base_url}/chat/completions"
        data: dict[str, Any] | None
        if self._unstreamed:
            data = await self._post_json(url, body, self._headers())
        else:
            assembly = ChatStream(on_text, self._malformed)
            streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
            try:
                data = await self._post_stream(url, streamed, self._headers(), assembly)
            except PermanentError as exc:
                prefix = f"{self.name} answered 400"
                if not str(exc).startswith(prefix) or "stream" not in str(exc).removeprefix(prefix).lower():
                    raise
                # a compatible server that does not take stream or stream_options: asked whole, now and from now on
                log.warning("%s refused a streamed request (%s); its calls are made unstreamed from now on",
                            self.name, exc)
                self._unstreamed = True
                data = await self._post_json(url, body, self._headers())
            if data is None:
                return assembly.body()
        text = _text(self._message(data).get("content"))
        if text:
            on_text(text)
        return data

    def _headers(self) -> dict[str, str]:
        key = self._key()
        # vLLM and Ollama run without a key: send no Authorization at all rather than an empty one
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _turn(self, data: dict[str, Any]) -> Turn:
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


class ChatStream:
    """Chat-completion chunks (``choices[0].delta``: content, refusal, tool-call pieces by index; usage in the last
    chunk) put back together as one chat completion; ``data: [DONE]`` ends the stream."""

    def __init__(self, on_text: TextSink, malformed: Callable[[str], TaskError]) -> None:
        self._on_text = on_text
        self._malformed = malformed
        self._content: list[str] | None = None
        self._refusal: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._finish: Any = None
        self._usage: Any = None
        self._done = False

    def feed(self, event: SSEEvent) -> bool:
        if event.data.strip() == "[DONE]":
            self._done = True
            return True
        try:
            chunk = json.loads(event.data)
        except ValueError:
            raise self._malformed("a stream chunk that is not JSON") from None
        if not isinstance(chunk, dict):
            raise self._malformed("a stream chunk that is not a JSON object")
        if chunk.get("error") is not None:
            raise self._malformed(f"the stream reported an error: {_excerpt(chunk['error'])}")
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self._choice(choice)
        return False

    def _choice(self, choice: dict[str, Any]) -> None:
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        text = _text(delta.get("content"))
        if text is not None:
            self._content = [*(self._content or ()), text]
            if text:
                self._on_text(text)
        if isinstance(delta.get("refusal"), str):
            self._refusal.append(delta["refusal"])
        for piece in delta.get("tool_calls") or []:
            if not isinstance(piece, dict):
                continue
            index = piece.get("index", len(self._calls))
            call = self._calls.setdefault(index if isinstance(index, int) else len(self._calls), {"arguments": []})
            if isinstance(piece.get("id"), str):
                call["id"] = piece["id"]
            function = piece.get("function")
            if isinstance(function, dict):
                if isinstance(function.get("name"), str):
                    call["name"] = call.get("name", "") + function["name"]
                if isinstance(function.get("arguments"), str):
                    call["arguments"].append(function["arguments"])

    def complete(self) -> bool:
        return self._done

    def body(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": None if self._content is None else
                                   "".join(self._content)}
        if self._refusal:
            message["refusal"] = "".join(self._refusal)
        if self._calls:
            message["tool_calls"] = [
                {"type": "function", **({"id": c["id"]} if "id" in c else {}),
                 "function": {**({"name": c["name"]} if "name" in c else {}), "arguments": "".join(c["arguments"])}}
                for _, c in sorted(self._calls.items())
            ]
        data: dict[str, Any] = {"choices": [{"index": 0, "message": message, "finish_reason": self._finish}]}
        if self._usage is not None:
            data["usage"] = self._usage
        return data


def _excerpt(error: object) -> str:
    message = error.get("message") if isinstance(error, dict) else error
    return " ".join(str(message).split())[:200]


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
