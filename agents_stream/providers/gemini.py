"""The Gemini client: one ``generateContent`` call per completion, key in the ``x-goog-api-key`` header."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from agents_stream.contract.errors import TaskError
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

__all__ = ["GeminiProvider"]

#: finish reasons that mean the model declined: retrying the same prompt will not help
_REFUSALS = frozenset({"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY"})


class GeminiProvider(HTTPProvider):
    """Google's Generative Language API (``/v1beta/models/{model}:generateContent``)."""

    default_base_url = "https://generativelanguage.googleapis.com"

    async def complete(self, prompt: Prompt) -> Completion:
        data = await self._generate(self._body(prompt))
        text, usage = self._parse(data)
        return Completion(text=text, usage=usage, provider=self.name, model=self.model)

    async def converse(self, conversation: Conversation) -> Turn:
        return self._turn(await self._generate(self._contents(conversation)))

    async def complete_stream(self, prompt: Prompt, on_text: TextSink) -> Completion:
        text, usage = self._parse(await self._streamed(self._body(prompt), on_text))
        return Completion(text=text, usage=usage, provider=self.name, model=self.model)

    async def converse_stream(self, conversation: Conversation, on_text: TextSink) -> Turn:
        return self._turn(await self._streamed(self._contents(conversation), on_text))

    async def _streamed(self, body: dict[str, Any], on_text: TextSink) -> dict[str, Any]:
        """``:streamGenerateContent?alt=sse``: the partial responses as the one ``generateContent`` answers (a
        gateway that answers whole instead: that response, its text given at once)."""
        assembly = ContentStream(on_text, self._malformed)
        data = await self._post_stream(self._url("streamGenerateContent") + "?alt=sse", body, self._headers(),
                                       assembly)
        if data is None:
            return assembly.body()
        text = "".join(_texts(self._parts(data)))
        if text:
            on_text(text)
        return data

    def _turn(self, data: dict[str, Any]) -> Turn:
        parts = self._parts(data)
        calls = []
        for part in parts:
            call = part.get("functionCall")
            if not isinstance(call, dict):
                continue
            if not isinstance(call.get("name"), str):
                raise self._malformed("a functionCall without a name")
            arguments, error = parse_arguments(call.get("args"))
            # functionCall.id is optional in this API: a call without one gets its id from the agent loop
            call_id = call["id"] if isinstance(call.get("id"), str) else ""
            signature = part.get("thoughtSignature") if isinstance(part.get("thoughtSignature"), str) else None
            calls.append(ToolCall(call_id, call["name"], arguments, error, signature))
        texts = _texts(parts)
        if not texts and not calls:
            raise self._malformed("candidate without a text or functionCall part")
        return Turn("".join(texts), tuple(calls), _usage(data), self.name, self.model)

    async def _generate(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._post_json(self._url("generateContent"), body, self._headers())

    def _url(self, method: str) -> str:
        model = quote(self.model.removeprefix("models/"), safe="")
        return f"{self.base_url}/v1beta/models/{model}:{method}"

    def _headers(self) -> dict[str, str]:
        key = self._key()
        # the header, never ?key=: URLs end up in logs, proxies and exception messages
        return {"x-goog-api-key": key} if key else {}

    def _contents(self, conversation: Conversation) -> dict[str, Any]:
        contents: list[dict[str, Any]] = []
        for m in conversation.messages:
            match m:
                case UserText(text=text):
                    contents.append({"role": "user", "parts": [{"text": text}]})
                case AssistantTurn(text=text, calls=calls):
                    parts: list[dict[str, Any]] = [{"text": text}] if text else []
                    for c in calls:
                        part: dict[str, Any] = {"functionCall": {"id": c.id, "name": c.name, "args": c.arguments}}
                        if c.signature:
                            part["thoughtSignature"] = c.signature
                        parts.append(part)
                    contents.append({"role": "model", "parts": parts})
                case ToolResult(call_id=call_id, name=name, content=content, error=error):
                    answer = {"id": call_id, "name": name, "response": {"error" if error else "result": content}}
                    last = contents[-1] if contents else None
                    if last is not None and last["role"] == "user" and "functionResponse" in last["parts"][0]:
                        last["parts"].append({"functionResponse": answer})  # one turn's answers in one content
                    else:
                        contents.append({"role": "user", "parts": [{"functionResponse": answer}]})
        body: dict[str, Any] = {
            "contents": contents,
            "generationConfig": {"maxOutputTokens": conversation.max_tokens or self.config.max_tokens},
        }
        if conversation.system:
            body["systemInstruction"] = {"parts": [{"text": conversation.system}]}
        if conversation.tools:
            body["tools"] = [{"functionDeclarations": [
                {"name": t.name, "description": t.description, "parametersJsonSchema": t.parameters}
                for t in conversation.tools
            ]}]
        return body

    def _body(self, prompt: Prompt) -> dict[str, Any]:
        body: dict[str, Any] = {
            "contents": [{"role": "user", "parts": [{"text": render_prompt(prompt)}]}],
            "generationConfig": {"maxOutputTokens": prompt.max_tokens or self.config.max_tokens},
        }
        if prompt.system:
            body["systemInstruction"] = {"parts": [{"text": prompt.system}]}
        return body

    def _parse(self, data: dict[str, Any]) -> tuple[str, Usage]:
        texts = _texts(self._parts(data))
        if not texts:
            raise self._malformed("candidate without a text part")
        return "".join(texts), _usage(data)

    def _parts(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        """The first candidate's parts; a refusal or a malformed answer raises."""
        feedback = data.get("promptFeedback")
        if isinstance(feedback, dict) and feedback.get("blockReason"):
            raise self._refused(f"prompt blocked: {feedback['blockReason']}")
        candidates = data.get("candidates")
        if not isinstance(candidates, list) or not candidates or not isinstance(candidates[0], dict):
            raise self._malformed("no candidates")
        candidate = candidates[0]
        finish = candidate.get("finishReason")
        if finish in _REFUSALS:
            raise self._refused(f"finishReason {finish}")
        content = candidate.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        if not isinstance(parts, list):
            raise self._malformed("candidate without content.parts")
        return [p for p in parts if isinstance(p, dict)]


class ContentStream:
    """Partial GenerateContentResponses (each with the next parts of candidate 0; the last with its finishReason
    and the usage) put back together as one response. The stream has no closing event: it is complete once a
    candidate said why it finished (or the prompt was blocked)."""

    def __init__(self, on_text: TextSink, malformed: Callable[[str], TaskError]) -> None:
        self._on_text = on_text
        self._malformed = malformed
        self._parts: list[dict[str, Any]] = []
        self._candidate: dict[str, Any] = {}
        self._rest: dict[str, Any] = {}  # usageMetadata, promptFeedback, modelVersion: the last one given
        self._seen = False

    def feed(self, event: SSEEvent) -> bool:
        try:
            data = json.loads(event.data)
        except ValueError:
            raise self._malformed("a stream chunk that is not JSON") from None
        if not isinstance(data, dict):
            raise self._malformed("a stream chunk that is not a JSON object")
        if isinstance(data.get("error"), dict):
            raise self._malformed(f"the stream reported an error: {str(data['error'].get('message'))[:200]}")
        self._seen = True
        self._rest.update({k: v for k, v in data.items() if k != "candidates"})
        candidates = data.get("candidates")
        candidate = candidates[0] if isinstance(candidates, list) and candidates else None
        if not isinstance(candidate, dict):
            return False
        self._candidate.update({k: v for k, v in candidate.items() if k != "content"})
        content = candidate.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        for part in parts if isinstance(parts, list) else ():
            if not isinstance(part, dict):
                continue
            self._parts.append(part)
            if isinstance(part.get("text"), str) and not part.get("thought") and part["text"]:
                self._on_text(part["text"])
        return False

    def complete(self) -> bool:
        feedback = self._rest.get("promptFeedback")
        blocked = isinstance(feedback, dict) and bool(feedback.get("blockReason"))
        return self._seen and (blocked or bool(self._candidate.get("finishReason")))

    def body(self) -> dict[str, Any]:
        if not self._candidate and not self._parts:
            return dict(self._rest)
        candidate = {**self._candidate, "content": {"role": "model", "parts": self._parts}}
        if not self._parts and self._candidate.get("finishReason") in _REFUSALS:
            del candidate["content"]
        return {**self._rest, "candidates": [candidate]}


def _texts(parts: list[dict[str, Any]]) -> list[str]:
    # thinking models add parts flagged "thought"; they are not the answer
    return [p["text"] for p in parts if isinstance(p.get("text"), str) and not p.get("thought")]


def _usage(data: dict[str, Any]) -> Usage:
    meta = data.get("usageMetadata")
    meta = meta if isinstance(meta, dict) else {}
    return Usage(
        input_tokens=_count(meta.get("promptTokenCount")), output_tokens=_count(meta.get("candidatesTokenCount")),
    )


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
