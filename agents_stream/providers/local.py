"""The ``local`` provider: a deterministic answer with no network and no key, so demos run anywhere."""

from __future__ import annotations

import asyncio
import hashlib
import json

from agents_stream.config import ProviderConfig
from agents_stream.providers.base import Completion, Prompt, Provider, Usage, render_prompt
from agents_stream.providers.conversation import Conversation, Turn, UserText

__all__ = ["LocalProvider"]


class LocalProvider(Provider):
    """Answers ``[local:<model>] <instruction> #<digest>``: the same prompt always gets the same text."""

    def __init__(self, config: ProviderConfig) -> None:
        super().__init__(config)
        self.name = config.name or config.kind

    async def complete(self, prompt: Prompt) -> Completion:
        if self.config.latency_s:
            # bounded by configuration; lets demos show in-flight work and timeouts
            await asyncio.sleep(self.config.latency_s)
        text = f"[local:{self.model}] {prompt.instruction[:200]} #{_digest(prompt)}"
        sent = f"{prompt.system}\n{render_prompt(prompt)}"
        usage = Usage(input_tokens=len(sent.split()), output_tokens=len(text.split()))
        return Completion(text=text, usage=usage, provider=self.name, model=self.model)

    async def converse(self, conversation: Conversation) -> Turn:
        """Calls no tool: answers the task (the first user message) as ``complete`` would."""
        first = next((m.text for m in conversation.messages if isinstance(m, UserText)), "")
        completion = await self.complete(Prompt(instruction=first, system=conversation.system))
        return Turn(completion.text, (), completion.usage, self.name, self.model)


def _digest(prompt: Prompt) -> str:
    # the context takes part so two tasks with one instruction but different inputs differ
    payload = json.dumps(
        {"instruction": prompt.instruction, "context": prompt.context},
        sort_keys=True,
        ensure_ascii=False,
        default=str,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:12]
