"""Human handoff: a conversation handed to a person, answered by them, and handed back to its agent (pure).

The handoff state is part of the conversation's head (tables/conversations.py: ``held_by`` and its fields), so it
lives where the rest of the conversation does — the changelog-backed conversations table — and moves with it on a
failover. ``held_by`` is None while the agent answers, ``""`` while the conversation waits for a person (handed over
by the agent, by a provider outage, or put in the queue by an operator), and the operator's name once one holds it.

While it is held no round starts (``conversations._start_next``): a customer's message waits in the head's
``waiting`` list, which is the operator's inbox. A person's reply answers every message waiting and becomes a
history item of role ``operator``, sent as the conversation's reply with ``human: true``; the hand back writes
the operator's note as a history item of role ``note`` — the next round's model sees it in its history — and
starts a round for any message still waiting. Every operator action carries an ``action_id``; the head keeps the
last ``MAX_ACTIONS`` ids, so a double click, a client's retry or a redelivery after a kill is applied once (a
reply applied before is only sent again, byte for byte). Docs: docs/guide/handoff.md.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Sequence

from agents_stream.tables import handoff_wait
from agents_stream.tables.conversations import (
    Change,
    ConversationRecord,
    Read,
    SendReply,
    _append,
    _dump,
    _event,
    _start_next,
    item_key,
    message_key,
    reply_of,
)

__all__ = [
    "HANDED_OVER", "MAX_ACTIONS", "MAX_TEXT", "OUTAGE_REASON", "Problem", "hand_back", "hand_over", "inbox_entry",
    "person_reply", "requested",
]

#: how the ``handoff`` tool's result begins (execution/handoff_tool.py): the ledger finds it in a round's journal
HANDED_OVER = "Handed to a person:"
#: why a conversation an outage handed over waits for a person (execution/outage.py)
OUTAGE_REASON = "no model provider could answer for the agent's handoff_after_s"
#: operator actions remembered per conversation (their ids): more than any double click or retry spans
MAX_ACTIONS = 50
#: the longest reply or note an operator may send (characters); a longer one is refused with a 400
MAX_TEXT = 16_000


class Problem(Exception):
    """An operator action that does not apply: ``status`` is the HTTP status the views answer with."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


def _actions(head: ConversationRecord) -> list[dict[str, Any]]:
    return list(json.loads(head.actions))


def _remember(head: ConversationRecord, action_id: str, item: int | None = None) -> str:
    return _dump((_actions(head) + [{"id": action_id, "item": item}])[-MAX_ACTIONS:])


def _seen(head: ConversationRecord, action_id: str | None) -> dict[str, Any] | None:
    if action_id is None:
        return None
    return next((a for a in _actions(head) if a["id"] == action_id), None)


def hand_over(
    head: ConversationRecord | None, *, by: str, reason: str, source: str, now: float, action_id: str | None = None,
    levels: Sequence[tuple[str, float]] = (),
) -> Change:
    """The conversation is handed to a person (``source``: agent, outage or operator). ``by`` is the operator who
    takes it ("" : it waits in the queue for one, under the escalation ``levels``: (name, timeout_s) each; see
    tables/handoff_wait.py). Taking one that waits for a person claims it and stops its timers; anything else
    applied again changes nothing."""
    if head is None or _seen(head, action_id) is not None:
        return Change()
    actions = _remember(head, action_id) if action_id is not None else head.actions
    if head.held_by is not None:
        if head.held_by or not by:
            return Change()  # held already (a double click, a redelivery, a second handoff)
        taken = handoff_wait.taken(replace(head, held_by=by, actions=actions, updated_at=now), by, now)
        return Change(head=taken, events=[_event(f"handoff:{head.handoffs}:taken", "taken", None, {"by": by})])
    number = head.handoffs + 1
    held = handoff_wait.begin(replace(head, held_by=by, held_reason=reason, held_source=source, held_at=now,
                                      handoffs=number, actions=actions, held_wait=None, updated_at=now), levels, now)
    event = _event(f"handoff:{number}", "handed_over", None, {"by": by or None, "reason": reason, "source": source})
    return Change(head=held, events=[event])


def person_reply(
    head: ConversationRecord | None, read: Read, cid: str, *, action_id: str, text: str, by: str, now: float,
) -> Change:
    """A person's reply: it answers every message waiting (one reply, ``human: true``) and, when the conversation
    waited for anyone, makes ``by`` the one who holds it. Raises Problem when it does not apply."""
    if head is None:
        raise Problem(404, f"unknown conversation {cid!r}")
    seen = _seen(head, action_id)
    if seen is not None:  # the same reply again: sent again as it was, nothing else
        item = read(item_key(cid, seen["item"])) if seen.get("item") is not None else None
        return Change(effects=[SendReply(reply_of(item))] if item else [])
    if head.held_by is None:
        raise Problem(409, "the conversation is not held by a person: hand it over first (POST .../handoff)")
    if not text.strip() or len(text) > MAX_TEXT:
        raise Problem(400, f"a reply is 1 to {MAX_TEXT} characters")
    waiting = head.waiting_list()
    answered = [m for m in waiting if m["round"] is None]
    change = Change()
    items: list[dict[str, Any]] = []
    for m in answered:
        m["item"] = head.items + len(items)
        items.append({"role": "customer", "text": m["text"], "id": m["id"], "user": m.get("user"), "at": m["at"],
                      "round": None})
    index = head.items + len(items)
    reply = {"round": head.rounds, "message_ids": [m["id"] for m in answered], "status": "succeeded", "text": text,
             "task_id": None, "error": None, "completed_at": now, "human": True, "operator": by}
    items.append({"role": "operator", "text": text, "round": head.rounds, "at": now, "status": "succeeded",
                  "message_ids": reply["message_ids"], "task_id": None, "error": None, "human": True, "operator": by})
    for m in answered:
        change.writes[message_key(cid, m["id"])] = {"digest": m["digest"], "round": None, "reply": index}
    head = replace(head, waiting=_dump([m for m in waiting if m["round"] is not None]), held_by=head.held_by or by,
                   actions=_remember(head, action_id, index), updated_at=now)
    head = handoff_wait.taken(head, by, now)  # a reply to a conversation waiting for anyone takes it
    change.head = _append(head, cid, change, items)
    change.effects.append(SendReply(reply))
    change.events.append(_event(f"reply:person:{action_id}", "reply", None, reply))
    return change


def hand_back(
    head: ConversationRecord | None, cid: str, *, action_id: str, note: str, by: str, now: float,
) -> Change:
    """The person hands the conversation back to its agent with ``note`` (a history item the next round's model
    sees); a round starts for the messages still waiting. Raises Problem when it does not apply."""
    if head is None:
        raise Problem(404, f"unknown conversation {cid!r}")
    if _seen(head, action_id) is not None:
        return Change()
    if head.held_by is None:
        raise Problem(409, "the conversation is not held by a person: nothing to hand back")
    if len(note) > MAX_TEXT:
        raise Problem(400, f"a note is at most {MAX_TEXT} characters")
    change = Change(events=[_event(f"handoff:{head.handoffs}:back", "handed_back", None,
                                   {"by": by, "note": note or None})])
    head = replace(head, held_by=None, held_reason=None, held_source=None, held_at=None, held_wait=None,
                   actions=_remember(head, action_id), updated_at=now)
    if note.strip():
        head = _append(head, cid, change, [{"role": "note", "text": note, "round": None, "at": now, "by": by}])
    change.head = _start_next(head, cid, change, now) if head.answering is None else head
    return change


def requested(entries: list[Any]) -> str | None:
    """The reason of the agent's ``handoff`` call in a round's journal (the first that succeeded), or None."""
    for entry in entries:
        if (isinstance(entry, dict) and entry.get("kind") == "tool" and entry.get("name") == "handoff"
                and not entry.get("error") and isinstance(entry.get("content"), str)
                and entry["content"].startswith(HANDED_OVER)):
            reason = entry["content"][len(HANDED_OVER):].strip().split("\n", 1)[0]
            return reason or "the agent asked for a person"
    return None


def inbox_entry(cid: str, head: ConversationRecord, now: float) -> dict[str, Any]:
    """A held conversation as the operator's inbox lists it: who holds it, why, since when, what waits, and its
    wait's escalation level, due time and escalations (tables/handoff_wait.py)."""
    waiting = [{k: m.get(k) for k in ("id", "text", "user", "at")} for m in head.waiting_list() if m["round"] is None]
    return {"conversation_id": cid, "agent": head.agent, "held_by": head.held_by or None, "reason": head.held_reason,
            "source": head.held_source, "held_at": head.held_at,
            "waiting_s": round(now - head.held_at, 3) if head.held_at is not None else None,
            "answering": head.answering, "waiting": waiting, **handoff_wait.describe(head)}
