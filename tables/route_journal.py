"""A routed run's journal: the route decided, the escalations, and each handler's own part of it (pure).

A routed agent's run (execution/handlers.py) journals its decision before any handler runs, as a ``route`` entry
of the task's journal (a JournalEntry, durable before the handler starts), and each escalation as an ``escalated``
entry. A run started again on that journal (a crash, a takeover, a hold, an interrupt) reads them back here: it
never routes again (no rule read again, no classifier asked again) and goes on with the handler the journal
names, on that handler's part of the journal — the entries after the last route or escalation.

Entries:

    {"kind": "route", "turn": -1, "handler": "faq", "by": "rule" | "classifier" | "fallback", "reason": "...",
     "source": "classifier:small:gpt-4o-mini" | None, "provider_calls": 1, "usage": {...}}
    {"kind": "escalated", "turn": -1, "from": "faq", "to": "support", "reason": "...", "answer": "..." | None,
     "tools": [{"name", "content", "error"}], "provider_calls": 1, "usage": {...}}
                                                  (what the weaker handler came to, and what it cost)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ESCALATED", "ROUTE", "RouteState", "below", "gathered_text", "handler_part", "read", "route_transcript",
    "tools_of", "usage_of",
]

ROUTE = "route"
ESCALATED = "escalated"
#: what an escalation keeps of the weaker handler's answer and of each tool result it got (characters)
ANSWER_CHARS = 2000
TOOL_CHARS = 500
#: best first (config.CONFIDENCE_ORDER without "failed", which is always below)
_ORDER = ("high", "medium", "low")


@dataclass
class RouteState:
    """The route journaled so far: its decision (None: not routed yet), escalations, and the handler now."""

    decision: dict[str, Any] | None = None
    escalations: list[dict[str, Any]] = field(default_factory=list)
    #: the index of the first entry of the current handler's part
    base: int = 0

    @property
    def handler(self) -> str | None:
        if self.escalations:
            return str(self.escalations[-1]["to"])
        return str(self.decision["handler"]) if self.decision is not None else None


def read(entries: list[Any]) -> RouteState:
    """The route of a journal. A second route entry (a stale run's, which the ledger would not keep) is ignored."""
    state = RouteState()
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        kind = entry.get("kind")
        if kind == ROUTE and state.decision is None:
            state.decision, state.base = entry, index + 1
        elif kind == ESCALATED and state.decision is not None and entry.get("from") == state.handler:
            state.escalations.append(entry)
            state.base = index + 1
    return state


def handler_part(entries: list[Any], state: RouteState, *, keep_summary: bool) -> tuple[list[Any], int]:
    """The journal the current handler runs on, and how many entries before its part it carries: the round's
    summary (an agent loop or a prompt shows it), then every entry after the last route or escalation."""
    prefix = [e for e in entries[: state.base] if isinstance(e, dict) and e.get("kind") == "summary"] \
        if keep_summary else []
    return [*prefix, *entries[state.base:]], len(prefix)


def below(status: str, confidence: str, min_confidence: str) -> str | None:
    """Why an outcome escalates (a failure, a partial result, or a confidence below the route's), or None."""
    if status == "failed":
        return "it failed"
    if status != "succeeded":
        return f"its answer is {status}"
    if confidence not in _ORDER:
        return f"its confidence is {confidence}"
    if _ORDER.index(confidence) > _ORDER.index(min_confidence):
        return f"its confidence {confidence} is below the route's {min_confidence}"
    return None


def tools_of(part: list[Any]) -> list[dict[str, Any]]:
    """The tool results a handler's part of the journal holds, cut: what it gathered for the next one."""
    return [{"name": e.get("name"), "error": bool(e.get("error")), "content": _cut(e.get("content"), TOOL_CHARS)}
            for e in part if isinstance(e, dict) and e.get("kind") == "tool"]


def gathered_text(escalations: list[dict[str, Any]]) -> str:
    """What the stronger handler is told of the weaker ones before it: why each gave up, what it answered, what
    its tools returned. Empty when nothing escalated."""
    if not escalations:
        return ""
    lines = ["", "", "Earlier handlers of this message could not answer it well enough:"]
    for e in escalations:
        lines.append(f"- {e.get('from')}: {e.get('reason')}")
        if e.get("answer"):
            lines.append(f"  its answer: {e['answer']}")
        for t in e.get("tools") or []:
            lines.append(f"  its tool {t.get('name')}{' (error)' if t.get('error') else ''}: {t.get('content')}")
    lines.append("Use what they found; do not repeat an action that already succeeded.")
    return "\n".join(lines)


def usage_of(entries: list[Any]) -> tuple[int, int, int, float | None]:
    """The provider calls, tokens and cost of the route itself: the classifier and the handlers that escalated."""
    calls = tokens_in = tokens_out = 0
    cost: float | None = None
    state = read(entries)
    for entry in ([state.decision] if state.decision else []) + state.escalations:
        used = entry.get("usage") or {}
        calls += int(entry.get("provider_calls") or 0)
        tokens_in += int(used.get("input_tokens") or 0)
        tokens_out += int(used.get("output_tokens") or 0)
        if used.get("cost") is not None:
            cost = (cost or 0.0) + float(used["cost"])
    return calls, tokens_in, tokens_out, cost


def route_transcript(entries: list[Any]) -> dict[str, Any] | None:
    """What a result's transcript says of the route: the handler that answered, the decision, its classifier's
    cost, each escalation. None: the journal holds no route."""
    state = read(entries)
    if state.decision is None:
        return None
    d = state.decision
    return {
        "handler": state.handler, "first": d.get("handler"), "by": d.get("by"), "reason": d.get("reason"),
        "source": d.get("source"), "usage": d.get("usage"),
        "escalations": [{"from": e.get("from"), "to": e.get("to"), "reason": e.get("reason")}
                        for e in state.escalations],
    }


def _cut(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
