"""The Anthropic Messages client: one ``POST /v1/messages`` per completion, key in the ``x-api-key`` header."""

from __future__ import annotations

from typing import Any

from agents_stream.providers.base import Completion, Prompt, Usage, render_prompt
from agents_stream.providers.http import HTTPProvider

__all__ = ["ANTHROPIC_VERSION", "AnthropicProvider"]

#: the API version the request and response shapes below are written against
ANTHROPIC_VERSION = "2023-06-01"


class AnthropicProvider(HTTPProvider):
    """``POST {base_url}/v1/messages``; like Gemini's, ``base_url`` is the host without the version."""

    default_base_url = "https://api.anthropic.com"

    async def complete(self, prompt: Prompt) -> Completion:
        key = self._key()
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        # a key-less gateway gets no x-api-key at all rather than an empty one
        if key:
            headers["x-api-key"] = key
        data = await self._post_json(f"{self.base_url}/v1/messages", self._body(prompt), headers)
        text, usage = self._parse(data)
        return Completion(text=text, usage=usage, provider=self.name, model=self.model)

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
        if data.get("stop_reason") == "refusal":
            raise self._refused("stop_reason refusal")
        content = data.get("content")
        if not isinstance(content, list):
            raise self._malformed("no content blocks")
        # thinking and tool_use blocks are not the answer
        texts = [
            block["text"]
            for block in content
            if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)
        ]
        if not texts:
            raise self._malformed("content without a text block")
        usage = data.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        return "".join(texts), Usage(
            input_tokens=_count(usage.get("input_tokens")),
            output_tokens=_count(usage.get("output_tokens")),
        )


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
