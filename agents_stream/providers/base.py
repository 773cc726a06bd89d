"""What every LLM provider client promises: one attempt, a bounded timeout, typed errors."""

from __future__ import annotations

import abc
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agents_stream.config import ProviderConfig

if TYPE_CHECKING:
    from agents_stream.providers.conversation import Conversation, Turn


#: where a streamed call's text goes, a piece at a time as the model writes it (must not raise: execution/chunks.py)
TextSink = Callable[[str], None]


@dataclass(frozen=True)
class Usage:
    """Token counts as the provider reported them (0 when it did not)."""

    input_tokens: int = 0
    output_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}


@dataclass(frozen=True)
class Prompt:
    """What a sub-agent asks a model."""

    instruction: str
    system: str = ""
    context: dict = field(default_factory=dict)
    max_tokens: int | None = None


@dataclass(frozen=True)
class Completion:
    """A model's answer and what it cost."""

    text: str
    usage: Usage
    provider: str
    model: str


def render_prompt(prompt: Prompt) -> str:
    """The user message every HTTP provider sends: the instruction, then the context as JSON."""
    if not prompt.context:
        return prompt.instruction
    # sort_keys: the same task renders the same bytes, so answers and caches stay comparable
    context = json.dumps(prompt.context, ensure_ascii=False, sort_keys=True, indent=2, default=str)
    return f"{prompt.instruction}\n\nContext (JSON):\n{context}"


class Provider(abc.ABC):
    """A client for one configured endpoint.

    ``complete`` makes exactly one attempt (one layer owns retries: the caller's, execution/call.py)
    and raises only the errors of ``agents_stream.contract.errors``: TransientError /
    RateLimited (timeouts, connection errors, 429, 5xx), PermanentError (400,
    refusals), SystemicError (401/403, bad configuration).
    """

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self.name = config.name
        self.model = config.model

    @abc.abstractmethod
    async def complete(self, prompt: Prompt) -> Completion:
        """One call; bounded by ``config.timeout_s``."""

    @abc.abstractmethod
    async def converse(self, conversation: Conversation) -> Turn:
        """One turn of a tool-calling conversation (the history translated to this API); raises as ``complete``."""

    async def complete_stream(self, prompt: Prompt, on_text: TextSink) -> Completion:
        """``complete`` with its text given to ``on_text`` as the model writes it; the Completion is the one
        ``complete`` returns. A provider without a streaming API gives the whole text once, at the end."""
        completion = await self.complete(prompt)
        if completion.text:
            on_text(completion.text)
        return completion

    async def converse_stream(self, conversation: Conversation, on_text: TextSink) -> Turn:
        """``converse`` with the turn's text given to ``on_text`` as the model writes it; the Turn (text, tool
        calls, usage) is the one ``converse`` returns."""
        turn = await self.converse(conversation)
        if turn.text:
            on_text(turn.text)
        return turn

    async def probe(self) -> bool:
        """True when the endpoint answers at all (any HTTP answer, even a 503: reachability, not health)."""
        return True

    async def ping(self) -> Completion:
        """The breaker's own probe: the smallest real call (a one-token answer to "ping"); raises as ``complete``.

        Not ``probe()``: an endpoint in an outage still answers that (a 503 is an answer), so only a real call
        tells the breaker the provider serves again.
        """
        return await self.complete(Prompt(instruction="ping", max_tokens=1))

    async def close(self) -> None:  # noqa: B027  (optional hook, not abstract)
        """Release connections."""
