"""A conversation's history as a round shows it to the model: earlier turns for a tool loop, text for one prompt."""

from __future__ import annotations

from agents_stream.contract.models import TaskPayload
from agents_stream.providers.conversation import AssistantTurn, Message, UserText

__all__ = ["earlier_turns", "with_history"]


def earlier_turns(task: TaskPayload) -> list[Message]:
    """The messages and replies before the round's own messages, as the conversation's earlier turns (none for a
    task that is not a conversation's round)."""
    if task.conversation is None:
        return []
    return [UserText(h.text) if h.role == "customer" else AssistantTurn(h.text) for h in task.conversation.history]


def with_history(task: TaskPayload, instruction: str) -> str:
    """One prompt's instruction with the conversation so far before it (an agent without tools gets one user
    message, so its history is written out)."""
    if task.conversation is None or not task.conversation.history:
        return instruction
    lines = [f"{'Customer' if h.role == 'customer' else 'You'}: {h.text}" for h in task.conversation.history]
    return "The conversation so far:\n" + "\n".join(lines) + "\n\nThe customer's new message:\n" + instruction
