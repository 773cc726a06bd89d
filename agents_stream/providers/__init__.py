"""LLM provider clients, built from configuration by ``kind``."""

from __future__ import annotations

from agents_stream.config import ProviderConfig
from agents_stream.providers.anthropic import AnthropicProvider
from agents_stream.providers.base import Completion, Prompt, Provider, Usage, render_prompt
from agents_stream.providers.gemini import GeminiProvider
from agents_stream.providers.local import LocalProvider
from agents_stream.providers.openai import OpenAIProvider

__all__ = [
    "Completion",
    "Prompt",
    "Provider",
    "Usage",
    "build_provider",
    "render_prompt",
]

_KINDS: dict[str, type[Provider]] = {
    "local": LocalProvider,
    "gemini": GeminiProvider,
    "openai": OpenAIProvider,
    "anthropic": AnthropicProvider,
}


def build_provider(config: ProviderConfig) -> Provider:
    """The client for one configured endpoint; ValueError for a kind this build cannot serve."""
    cls = _KINDS.get(config.kind)
    if cls is None:
        raise ValueError(f"provider {config.name!r}: unknown kind {config.kind!r}; known: {sorted(_KINDS)}")
    return cls(config)
