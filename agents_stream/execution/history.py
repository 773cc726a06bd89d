"""A conversation's history as a round shows it to the model: earlier turns for a tool loop, text for one prompt.

An agent that summarises older history (docs/conversations.md, "Summaries") shows its summary ahead of them: the
one its round journaled (execution/summary.py), else the one the round was given.
"""

from __future__ import annotations

from typing import Any

from agents_stream.contract.models import TaskPayload
from agents_stream.providers.conversation import AssistantTurn, Message, UserText

__all__ = ["HEADER", "earlier_turns", "journaled", "shown", "with_history"]

#: what the summary is introduced with where the model reads it (ahead of the window)
HEADER = "A summary of the earlier conversation (its older messages are not shown here):"
#: what an operator's hand-back note is introduced with (it is not the customer's words)
NOTE_HEADER = "A note from the person of the support team who handed this conversation back to you (not the customer):"


def journaled(entries: list[Any]) -> dict[str, Any] | None:
    """The journal's summary entry (the first: one is journaled per round), or None."""
    return next((e for e in entries if isinstance(e, dict) and e.get("kind") == "summary"), None)


def shown(task: TaskPayload, entries: list[Any]) -> str | None:
    """The summary the round shows the model ahead of its window: the one it journaled, else the one it was given
    (its summariser failed, or nothing new fell out of the window); None: none."""
    given = task.conversation.summary if task.conversation is not None else None
    if given is None:
        return None
    entry = journaled(entries)
    if entry is not None and isinstance(entry.get("text"), str) and entry["text"]:
        return str(entry["text"])
    return given.text


def earlier_turns(task: TaskPayload, summary: str | None = None) -> list[Message]:
    """The messages and replies before the round's own messages, as the conversation's earlier turns, after the
    summary of what came before them (none for a task that is not a conversation's round)."""
    if task.conversation is None:
        return []
    turns: list[Message] = [UserText(f"{HEADER}\n{summary}")] if summary else []
    return turns + [UserText(h.text) if h.role == "customer" else UserText(f"{NOTE_HEADER}\n{h.text}")
                     if h.role == "note" else AssistantTurn(h.text) for h in task.conversation.history]


def with_history(task: TaskPayload, instruction: str, summary: str | None = None) -> str:
    """One prompt's instruction with the conversation so far before it (an agent without tools gets one user
    message, so its history is written out), after the summary of what came before that."""
    if task.conversation is None or not (task.conversation.history or summary):
        return instruction
    names = {"customer": "Customer", "note": NOTE_HEADER}
    lines = [f"{names.get(h.role, 'You')}: {h.text}" for h in task.conversation.history]
    before = f"{HEADER}\n{summary}\n\n" if summary else ""
    so_far = "The conversation so far:\n" + "\n".join(lines) + "\n\n" if lines else ""
    return before + so_far + "The customer's new message:\n" + instruction
