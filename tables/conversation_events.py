"""A round's progress as events (pure): what changed between two records of its task, as the event stream shows
it (the conversation's own events, messages, rounds started and replies, come with its transitions).

Events go on ``agent.conversation.events`` keyed by conversation_id (docs/conversations.md, "Events"). Each has a
``id`` that names what happened (``message:<id>``, ``round:2:dispatch:1``, ``round:2:tool:1:call_7``, ``reply:2``):
the ledger may apply a transition again after a crash and send an event twice, and a reader shows each id once.
"""

from __future__ import annotations

from typing import Any

from agents_stream.tables.leases import (
    AWAITING_APPROVAL,
    AWAITING_SUBTASKS,
    TaskRecord,
    appended_steps,
    completed_steps,
)

__all__ = ["round_events"]

#: a tool result's content in an event is cut to this many characters (the journal keeps it whole)
CONTENT_CHARS = 2000


def round_events(number: int, old: TaskRecord | None, new: TaskRecord | None) -> list[dict[str, Any]]:
    """A round's dispatches, model turns, tool calls and results, and waits, between two records of its task."""
    if new is None or new == old:
        return []
    events: list[dict[str, Any]] = []
    if new.dispatch and (old is None or new.dispatch != old.dispatch):
        dispatched = {"attempt": new.dispatch}
        events.append(_event(f"round:{number}:dispatch:{new.dispatch}", "dispatched", number, dispatched))
    added = appended_steps(old, new)
    if added is None:  # not an append (a journal begun again): the steps after the old count
        before = len(completed_steps(old))
        done = completed_steps(new)
        earlier, added = done[:before], done[before:]
    else:  # old's steps are the ones before: parsed only when one of them may be an escalation
        earlier = completed_steps(old) if added and old is not None and _ESCALATED in (old.steps_done or "") else []
    # a routed round's escalated handler starts its turns at 0 again: its events' ids say which handler (":h<n>")
    stage = sum(1 for e in earlier if isinstance(e, dict) and e.get("kind") == "escalated")
    for entry in added:
        if isinstance(entry, dict):
            shown = _journal_event(number, entry)
            if stage and entry.get("kind") in _PER_HANDLER:
                shown = [{**e, "id": f"{e['id']}:h{stage}"} for e in shown]
            events += shown
            if entry.get("kind") == "escalated":
                stage += 1
    if new.state != (old.state if old is not None else None):
        if new.state == AWAITING_APPROVAL:
            events.append(_event(f"round:{number}:approval:{new.dispatch}:{len(completed_steps(new))}",
                                 "waiting_for_approval", number, {}))
        elif new.state == AWAITING_SUBTASKS:
            waiting = f"round:{number}:subtasks:{len(completed_steps(new))}"
            events.append(_event(waiting, "waiting_for_subagents", number, {}))
    return events


#: an escalation entry's kind as its journal's JSON holds it (a cheap test before parsing a journal)
_ESCALATED = '"escalated"'

#: journal kinds a handler's part of a routed round repeats (their ids begin again with each handler)
_PER_HANDLER = frozenset({"turn", "tool", "decision", "subresult"})


def _journal_event(number: int, entry: dict[str, Any]) -> list[dict[str, Any]]:
    kind, turn = entry.get("kind"), entry.get("turn")
    if kind == "route":  # a routed round's decision (execution/handlers.py): once per round
        used = entry.get("usage") or {}
        data = {"handler": entry.get("handler"), "by": entry.get("by"), "reason": entry.get("reason"),
                "source": entry.get("source"), "cost": used.get("cost"),
                "tokens": int(used.get("input_tokens") or 0) + int(used.get("output_tokens") or 0)}
        return [_event(f"round:{number}:route", "routed", number, data)]
    if kind == "escalated":
        data = {"from": entry.get("from"), "to": entry.get("to"), "reason": entry.get("reason")}
        return [_event(f"round:{number}:escalated:{entry.get('to')}", "escalated", number, data)]
    if kind == "turn":
        calls = [{"id": c.get("id"), "name": c.get("name"), "arguments": c.get("arguments")}
                 for c in entry.get("calls") or []]
        data = {"turn": turn, "text": entry.get("text") or "", "tool_calls": calls}
        return [_event(f"round:{number}:turn:{turn}", "turn", number, data)]
    if kind == "tool":
        content = str(entry.get("content") or "")
        data = {"turn": turn, "call_id": entry.get("id"), "name": entry.get("name"), "error": entry.get("error"),
                "content": content[:CONTENT_CHARS], "cut": len(content) > CONTENT_CHARS}
        return [_event(f"round:{number}:tool:{turn}:{entry.get('id')}", "tool_result", number, data)]
    if kind == "decision":
        data = {"turn": turn, "call_id": entry.get("id"), "decision": entry.get("decision"), "by": entry.get("by")}
        return [_event(f"round:{number}:decision:{turn}:{entry.get('id')}", "decision", number, data)]
    if kind == "summary":
        data = {"until": entry.get("until"), "error": entry.get("error"), "chars": len(entry.get("text") or "")}
        return [_event(f"round:{number}:summary", "summary", number, data)]
    if kind == "subresult":
        status = (entry.get("result") or {}).get("status")
        data = {"turn": turn, "call_id": entry.get("id"), "agent": entry.get("agent"), "status": status}
        return [_event(f"round:{number}:subresult:{turn}:{entry.get('id')}", "subagent_result", number, data)]
    return []


def _event(event_id: str, kind: str, number: int | None, data: dict[str, Any]) -> dict[str, Any]:
    return {"id": event_id, "kind": kind, "round": number, "data": data}
