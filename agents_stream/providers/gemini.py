"""The Gemini client: one ``generateContent`` call per completion, key in the ``x-goog-api-key`` header."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

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
        data = await self._generate(self._contents(conversation))
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
        key = self._key()
        # the header, never ?key=: URLs end up in logs, proxies and exception messages
        headers = {"x-goog-api-key": key} if key else {}
        model = quote(self.model.removeprefix("models/"), safe="")
        return await self._post_json(f"{self.base_url}/v1beta/models/{model}:generateContent", body, headers)

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
