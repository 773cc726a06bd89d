"""A provider-neutral conversation with tools: what an agent loop sends each turn, and the turn it gets back.

One shape for the three wire formats (OpenAI ``tools``/``tool_calls``, Anthropic
``tool_use``/``tool_result``, Gemini ``functionDeclarations``/``functionCall``/
``functionResponse``), so the ladder can carry a conversation that began on one
provider on to another: each provider translates the whole history when it sends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agents_stream.providers.base import Usage

__all__ = ["AssistantTurn", "Conversation", "Message", "ToolCall", "ToolResult", "ToolSpec", "Turn", "UserText"]


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model is told of it: its name, what it does, and the JSON Schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for; ``arguments`` is what it sent, ``error`` set when that was not a JSON object."""

    id: str
    name: str
    arguments: dict[str, Any]
    error: str | None = None
    #: Gemini's thoughtSignature of the part that asked for it: sent back with the call, as its API requires
    signature: str | None = None


@dataclass(frozen=True)
class UserText:
    text: str


@dataclass(frozen=True)
class AssistantTurn:
    """What the model said in one turn: text, the calls it asked for, or both."""

    text: str
    calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class ToolResult:
    """A tool's answer to one call, as the model reads it next turn (``error``: it failed, ``content`` says why)."""

    call_id: str
    name: str
    content: str
    error: bool = False


Message = UserText | AssistantTurn | ToolResult


@dataclass(frozen=True)
class Conversation:
    """Everything one turn sends: the system text, the history so far and the tools on offer."""

    system: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int | None = None


@dataclass(frozen=True)
class Turn:
    """A model's answer to a conversation: final text, or the tool calls it wants made first."""

    text: str
    calls: tuple[ToolCall, ...]
    usage: Usage
    provider: str
    model: str
    extra: dict[str, Any] = field(default_factory=dict)


def parse_arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    """A call's arguments as a dict: OpenAI sends a JSON string, the others an object. (arguments, error)."""
    if isinstance(raw, dict):
        return raw, None
    if raw is None or raw == "":
        return {}, None
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError as exc:
            return {}, f"arguments are not valid JSON: {exc}"
        if isinstance(value, dict):
            return value, None
    return {}, f"arguments must be a JSON object, got {type(raw).__name__}"
