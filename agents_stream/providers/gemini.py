"""The Gemini client: one ``generateContent`` call per completion, key in the ``x-goog-api-key`` header."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from agents_stream.providers.base import Completion, Prompt, Usage, render_prompt
from agents_stream.providers.http import HTTPProvider

__all__ = ["GeminiProvider"]

#: finish reasons that mean the model declined: retrying the same prompt will not help
_REFUSALS = frozenset({"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY"})


class GeminiProvider(HTTPProvider):
    """Google's Generative Language API (``/v1beta/models/{model}:generateContent``)."""

    default_base_url = "https://generativelanguage.googleapis.com"

    async def complete(self, prompt: Prompt) -> Completion:
        key = self._key()
        # the header, never ?key=: URLs end up in logs, proxies and exception messages
        headers = {"x-goog-api-key": key} if key else {}
        model = quote(self.model.removeprefix("models/"), safe="")
        url = f"{self.base_url}/v1beta/models/{model}:generateContent"
        data = await self._post_json(url, self._body(prompt), headers)
        text, usage = self._parse(data)
        return Completion(text=text, usage=usage, provider=self.name, model=self.model)

    def _body(self, prompt: Prompt) -> dict[str, Any]:
        body: dict[str, Any] = {
            "contents": [{"role": "user", "parts": [{"text": render_prompt(prompt)}]}],
            "generationConfig": {"maxOutputTokens": prompt.max_tokens or self.config.max_tokens},
        }
        if prompt.system:
            body["systemInstruction"] = {"parts": [{"text": prompt.system}]}
        return body

    def _parse(self, data: dict[str, Any]) -> tuple[str, Usage]:
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
        # thinking models add parts flagged "thought"; they are not the answer
        texts = [
            p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str) and not p.get("thought")
        ]
        if not texts:
            raise self._malformed("candidate without a text part")
        meta = data.get("usageMetadata")
        meta = meta if isinstance(meta, dict) else {}
        usage = Usage(
            input_tokens=_count(meta.get("promptTokenCount")),
            output_tokens=_count(meta.get("candidatesTokenCount")),
        )
        return "".join(texts), usage


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
