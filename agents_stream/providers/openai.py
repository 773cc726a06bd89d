"""The OpenAI-compatible chat-completions client (OpenAI, vLLM, Ollama, LiteLLM proxy)."""

from __future__ import annotations

from typing import Any

from agents_stream.providers.base import Completion, Prompt, Usage, render_prompt
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
        content = message.get("content")
        if isinstance(content, list):  # some proxies answer in content parts
            content = "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        if not isinstance(content, str):
            raise self._malformed("message without text content")
        usage = data.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        return content, Usage(
            input_tokens=_count(usage.get("prompt_tokens")),
            output_tokens=_count(usage.get("completion_tokens")),
        )


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
