"""A conversation's state machine: its messages, rounds and replies, kept in records of bounded size (pure).

A conversation is several keys of the ``conversations`` table, none of which grows with its length, so what one
message costs (bytes written, records read) is the same at its first message and its thousandth:
- the **head** (key: the conversation_id): its agent, its rounds, the messages waiting for a round and how many
  history items there are;
- one **message key** per message (``message_key``): its digest, its round and the item of its reply (duplicates,
  conflicts);
- one **item key** per history item (``item_key``): every message and reply in the order the conversation went,
  however long it runs; a round reads the last few for the model, a page of the view reads a range.
A transition reads what it needs through ``read`` (the table's ``get``) and returns a ``Change``: the new head,
the other keys to write, the effects and the conversation's events. A message that arrives while no round is open
starts round n+1, which answers every message waiting; one that arrives while a round is open waits for the next
round (``enqueue``) or is answered at once with a refusal (``reject``). Every transition is idempotent: the ledger
may apply the same message or the same round's end again after a crash (docs/conversations.md, "Crashes").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from agents_stream.tables.json_record import JsonRecord

RECORD_VERSION = 2

ENQUEUE = "enqueue"
REJECT = "reject"
INTERRUPT = "interrupt"

#: the reply a message gets when it arrives while a round is answering and its agent rejects double texting
REJECTED_TEXT = (
    "I am still answering your earlier message, so this one was not taken; send it again once you have my answer."
)
#: messages that may wait for a round at once; past it a message is refused (conversation_backlog_full)
MAX_WAITING = 100
#: a table key's parts are joined with a control character, which no conversation or message id may contain
SEP = "\x1f"

Read = Callable[[str], Any]


def message_key(cid: str, message_id: str) -> str:
    return f"{cid}{SEP}m{SEP}{message_id}"


def item_key(cid: str, i: int) -> str:
    return f"{cid}{SEP}i{SEP}{i}"


def summary_key(cid: str) -> str:
    """The conversation's summary of its older history: text, and the item index it covers up to (summaries.py)."""
    return f"{cid}{SEP}s"


def conversation_id_of(key: str) -> str:
    """The conversation a key of the conversations table belongs to."""
    return key.split(SEP, 1)[0]


@dataclass(frozen=True)
class ConversationRecord(JsonRecord):
    """A conversation's head (versioned JSON)."""

    agent: str
    #: the offset of the message that began the conversation (its rounds' task ids carry it:
    #: contract/conversation_messages)
    since: int = -1
    #: how many rounds were started; the round answering now, or None (idle)
    rounds: int = 0
    answering: int | None = None
    #: JSON list, in arrival order, of the messages no round has answered yet: {id, digest, text, user, context,
    #: at, round} (``round``: the round answering it, None while it waits for one; ``item``: its history index)
    waiting: str = "[]"
    #: how many history items there are, and how many messages were taken
    items: int = 0
    messages: int = 0
    updated_at: float = 0.0
    #: who asked to delete the conversation while a round answered: it is deleted when that round ends
    deleting: str | None = None
    #: who holds the conversation now that it was handed to a person (tables/handoff.py); None: the agent answers
    held_by: str | None = None
    #: why it was handed over, by whom (``agent``, ``operator``, ``outage``) and when; how many handoffs so far
    held_reason: str | None = None
    held_source: str | None = None
    held_at: float | None = None
    handoffs: int = 0
    #: JSON list of the last operator actions applied ({"id", "item"}): a double click or a redelivery is one action
    actions: str = "[]"
    #: JSON of the wait for a person under escalation levels (tables/handoff_wait.py); None: no levels, or not waiting
    held_wait: str | None = None
    v: int = RECORD_VERSION

    @property
    def status(self) -> str:
        if self.held_by is not None and self.answering is None:
            return "with_person"
        return "idle" if self.answering is None else "answering"

    def waiting_list(self) -> list[dict[str, Any]]:
        return list(json.loads(self.waiting))

    def to_json(self) -> dict[str, Any]:
        # the handoff's fields only once it was handed over: a head never handed over keeps its bytes
        return {name: getattr(self, name) for name in self.__dataclass_fields__
                if name not in _HANDOFF_DEFAULTS or getattr(self, name) != _HANDOFF_DEFAULTS[name]}


#: the handoff's fields of the head and their values while it never was handed over
_HANDOFF_DEFAULTS: dict[str, Any] = {"held_by": None, "held_reason": None, "held_source": None, "held_at": None,
                                     "handoffs": 0, "actions": "[]", "held_wait": None}


# Effects: what the ledger must do after a transition.
@dataclass(frozen=True)
class StartRound:
    """Make this round's task (answering ``message_ids``) and dispatch it."""

    round: int
    message_ids: tuple[str, ...]


@dataclass(frozen=True)
class SendReply:
    """Send this reply (a dict of ConversationReply's fields but the conversation's) on ``agent.replies``."""

    reply: dict[str, Any]


@dataclass(frozen=True)
class Refuse:
    """The message cannot be taken: one dead letter with this reason (layer 1)."""

    reason: str
    detail: str


@dataclass(frozen=True)
class Interrupt:
    """Ask the open round's run to stop at its next safe point, so that it answers the new message too."""

    round: int


@dataclass(frozen=True)
class DeleteRounds:
    """Delete the task records of rounds 1..``rounds`` of the conversation begun at ``since`` (their journals hold
    the tool calls and their output)."""

    rounds: int
    since: int


Effect = StartRound | SendReply | Refuse | Interrupt | DeleteRounds


@dataclass
class Change:
    """A transition: the new head (None: unchanged), other keys written (None: deleted), effects and events."""

    head: ConversationRecord | None = None
    writes: dict[str, Any] = field(default_factory=dict)
    effects: list[Effect] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


def receive(
    head: ConversationRecord | None, read: Read, *, cid: str, agent: str, message: dict[str, Any], policy: str,
    now: float, offset: int,
) -> Change:
    """A message arrived at ``offset``: ``message`` has id, digest, text, user and context."""
    if head is not None and head.agent != agent:
        why = f"conversation belongs to agent {head.agent!r}; a message for {agent!r} cannot join it"
        return Change(effects=[Refuse("conversation_agent_mismatch", why)])
    if head is not None and head.deleting is not None:
        return Change(effects=[Refuse("conversation_deleting", "the conversation is being deleted")])
    known = read(message_key(cid, message["id"]))
    if known and (known["digest"] != message["digest"] or _recorded(head, message["id"], known)):
        return _again(head, read, cid, message, known)
    head = head or ConversationRecord(agent=agent, since=offset, updated_at=now)
    waiting = head.waiting_list()
    if len(waiting) >= MAX_WAITING:
        return Change(effects=[Refuse(
            "conversation_backlog_full", f"{len(waiting)} messages already wait for this conversation's next round",
        )])
    change = Change(events=[_event(f"message:{message['id']}", "message", None, {
        "message_id": message["id"], "text": message["text"], "user": message.get("user"),
    })])
    entry = {**message, "at": now, "round": None}
    if head.answering is not None and policy == REJECT:
        reply = {"round": head.answering, "message_ids": [message["id"]], "status": "rejected",
                 "text": REJECTED_TEXT, "task_id": None, "error": None, "completed_at": now}
        change.writes[message_key(cid, message["id"])] = {"digest": message["digest"], "round": head.answering,
                                                          "reply": head.items + 1}
        head = _append(head, cid, change, [_item("customer", entry), _item("agent", reply)])
        change.head = replace(head, messages=head.messages + 1, updated_at=now)
        change.effects.append(SendReply(reply))
        change.events.append(_event(f"reply:{head.answering}:{message['id']}", "reply", head.answering, reply))
        return change
    change.writes[message_key(cid, message["id"])] = {"digest": message["digest"], "round": None, "reply": None}
    head = replace(head, waiting=_dump(waiting + [entry]), messages=head.messages + 1, updated_at=now)
    if head.answering is None:
        head = _start_next(head, cid, change, now)
    elif policy == INTERRUPT and head.held_by is None:
        change.effects.append(Interrupt(head.answering))
    change.head = head
    return change


def join_round(head: ConversationRecord, cid: str, number: int, now: float) -> tuple[Change, list[dict[str, Any]]]:
    """The messages waiting join the open round ``number`` (it stopped for them: ``interrupt``); the change, and
    the messages that joined (none: the round goes on as it was)."""
    waiting = head.waiting_list()
    joining = [m for m in waiting if m["round"] is None]
    if head.answering != number or not joining:
        return Change(), []
    change = Change()
    items: list[dict[str, Any]] = []
    for m in joining:
        m["round"], m["item"] = number, head.items + len(items)
        items.append(_item("customer", m))
        change.writes[message_key(cid, m["id"])] = {"digest": m["digest"], "round": number, "reply": None}
        change.events.append(_event(f"round:{number}:joined:{m['id']}", "message_joined", number,
                                    {"message_id": m["id"]}))
    head = replace(head, waiting=_dump(waiting), updated_at=now)
    change.head = _append(head, cid, change, items)
    return change, joining


def _recorded(head: ConversationRecord | None, message_id: str, known: dict[str, Any]) -> bool:
    """Whether the change that wrote the message's key ``known`` was recorded whole: its keys reach the changelog
    before its head, so a worker stopped in between leaves a key no head lists (the message is then new)."""
    if known.get("reply") is not None or head is None:
        return known.get("reply") is not None  # answered: its reply again
    if known.get("round") is None:
        return any(m["id"] == message_id for m in head.waiting_list())
    return head.rounds >= known["round"]


def _again(head: ConversationRecord | None, read: Read, cid: str, message: dict[str, Any], known: Any) -> Change:
    """A message_id seen before: a conflict, its reply again, its round made again, or nothing (it waits)."""
    if known["digest"] != message["digest"]:
        return Change(effects=[Refuse(
            "message_conflict", f"message_id {message['id']!r} was sent before with other content",
        )])
    item = read(item_key(cid, known["reply"])) if known.get("reply") is not None else None
    if item:
        return Change(effects=[SendReply(reply_of(item))])  # a duplicate: its reply again
    if head is not None and head.answering is not None and known["round"] == head.answering:
        # Its round again (idempotent): after a crash the round's task may never have been written.
        return Change(effects=[StartRound(head.answering, tuple(round_message_ids(head, head.answering)))])
    return Change()  # it waits: the next round answers it


@dataclass(frozen=True)
class RoundEnd:
    """How round ``number`` of the conversation begun at ``since`` ended: its task's status, the reply's ``text``
    (or ``error``), the task and when it completed."""

    since: int
    number: int
    status: str
    text: str
    task_id: str
    error: str | None
    completed_at: float
    #: "outage": the reply hands the conversation to a person (execution/outage.py); None: an ordinary reply
    handoff: str | None = None


def round_ended(head: ConversationRecord | None, read: Read, end: RoundEnd, *, cid: str, now: float) -> Change:
    """The round ``end`` names ended. Applied again (a redelivery), or a round of a conversation since deleted, it
    changes nothing."""
    since, number, status, text = end.since, end.number, end.status, end.text
    if head is None or head.answering != number or head.since != since:
        return Change()
    if head.deleting is not None:  # asked to delete while this round answered: deleted now, no reply
        return delete(replace(head, answering=None), read, cid, by=head.deleting, now=now)
    waiting = head.waiting_list()
    answered = [m for m in waiting if m["round"] == number]
    reply = {"round": number, "message_ids": [m["id"] for m in answered], "status": status, "text": text,
             "task_id": end.task_id, "error": end.error, "completed_at": end.completed_at}
    if end.handoff is not None:
        reply["handoff"] = end.handoff
    change = Change(effects=[SendReply(reply)],
                    events=[_event(f"reply:{number}", "reply", number, reply)])
    for m in answered:
        change.writes[message_key(cid, m["id"])] = {"digest": m["digest"], "round": number, "reply": head.items}
    head = replace(head, waiting=_dump([m for m in waiting if m["round"] != number]), answering=None,
                   updated_at=now)
    head = _append(head, cid, change, [_item("agent", reply)])
    change.head = _start_next(head, cid, change, now)
    return change


def _start_next(head: ConversationRecord, cid: str, change: Change, now: float) -> ConversationRecord:
    """Start the next round for the messages waiting (none waiting: the head as it is). While a person holds the
    conversation no round starts: its messages wait in the operator's inbox (tables/handoff.py)."""
    waiting = head.waiting_list()
    if head.held_by is not None or not any(m["round"] is None for m in waiting):
        return head
    number = head.rounds + 1
    items: list[dict[str, Any]] = []
    for m in waiting:
        if m["round"] is None:
            m["round"], m["item"] = number, head.items + len(items)
            items.append(_item("customer", m))
            change.writes[message_key(cid, m["id"])] = {"digest": m["digest"], "round": number, "reply": None}
    ids = tuple(m["id"] for m in waiting if m["round"] == number)
    head = replace(head, waiting=_dump(waiting), rounds=number, answering=number, updated_at=now)
    head = _append(head, cid, change, items)
    change.effects.append(StartRound(number, ids))
    change.events.append(_event(f"round:{number}:started", "round_started", number, {"message_ids": list(ids)}))
    return head


def _item(role: str, source: dict[str, Any]) -> dict[str, Any]:
    """A history item: a customer's message, or the agent's reply (with what a duplicate is answered with)."""
    if role == "customer":
        return {"role": role, "text": source["text"], "id": source["id"], "user": source.get("user"),
                "at": source["at"], "round": source["round"]}
    return {"role": role, "text": source["text"], "round": source["round"], "at": source["completed_at"],
            **{k: source[k] for k in ("status", "message_ids", "task_id", "error")},
            **({"handoff": source["handoff"]} if source.get("handoff") else {})}


def reply_of(item: dict[str, Any]) -> dict[str, Any]:
    """The reply a history item of the agent (or of a person: ``human``) stands for (ConversationReply's fields
    but the conversation's)."""
    reply = {"round": item["round"], "message_ids": item["message_ids"], "status": item["status"],
             "text": item["text"], "task_id": item["task_id"], "error": item["error"], "completed_at": item["at"]}
    if item.get("human"):
        reply.update(human=True, operator=item.get("operator"))
    if item.get("handoff"):
        reply["handoff"] = item["handoff"]
    return reply


def _append(head: ConversationRecord, cid: str, change: Change, items: list[dict[str, Any]]) -> ConversationRecord:
    """``items`` appended to the history, one key each."""
    for item in items:
        change.writes[item_key(cid, head.items)] = {**item, "i": head.items}
        head = replace(head, items=head.items + 1)
    return head


def round_message_ids(head: ConversationRecord, number: int) -> list[str]:
    return [m["id"] for m in head.waiting_list() if m["round"] == number]


def round_messages(head: ConversationRecord, number: int) -> list[dict[str, Any]]:
    """The messages round ``number`` answers, in arrival order."""
    return [m for m in head.waiting_list() if m["round"] == number]


def history(
    head: ConversationRecord, read: Read, cid: str, number: int, limit: int, chars: int,
) -> list[dict[str, str]]:
    """What came before round ``number``, oldest first: at most the last ``limit`` items and ``chars`` of text."""
    return window(head, read, cid, number, limit, chars)[0]


def window(
    head: ConversationRecord, read: Read, cid: str, number: int, limit: int, chars: int,
) -> tuple[list[dict[str, str]], int]:
    """``history``, and the index of its first item (where the older history, a summary's part, ends)."""
    mine = [m["item"] for m in round_messages(head, number) if "item" in m]
    first = min(mine) if mine else head.items
    kept: list[dict[str, str]] = []
    total = 0
    start = first
    for i in range(first - 1, max(first - limit, 0) - 1, -1):
        item = read(item_key(cid, i))
        if not item:
            start = i
            continue
        total += len(item["text"])
        if total > chars:
            break
        kept.append(model_item(item))
        start = i
    return kept[::-1], start


#: how a person's reply and an operator's note read where the model is shown the history
PERSON_SAID = "(A person of the support team answered the customer:) "


def model_item(item: dict[str, Any]) -> dict[str, str]:
    """A history item as a round shows it to the model: a person's reply as the desk's (marked), a hand-back
    note as a note (execution/history.py shows it as such)."""
    if item["role"] == "operator":
        return {"role": "agent", "text": PERSON_SAID + item["text"]}
    return {"role": item["role"], "text": item["text"]}


def page(head: ConversationRecord, read: Read, cid: str, *, before: int | None, limit: int) -> list[dict[str, Any]]:
    """History items ``[before - limit, before)`` (the last ``limit`` when ``before`` is None), oldest first."""
    end = head.items if before is None else max(0, min(before, head.items))
    found = (read(item_key(cid, i)) for i in range(max(0, end - limit), end))
    return [item for item in found if item]


def delete(
    head: ConversationRecord | None, read: Read, cid: str, *, by: str, now: float, idle_since: float | None = None,
) -> Change:
    """Every key of the conversation deleted, and its rounds' task records; while a round answers, once it ends.
    ``idle_since`` (the idle sweep's): only if nothing changed since then and no round answers."""
    if head is None:
        return Change()
    if idle_since is not None and (head.updated_at != idle_since or head.answering is not None):
        return Change()  # it moved on since the sweep saw it idle
    if head.answering is not None:
        return Change(head=replace(head, deleting=by, updated_at=now)) if head.deleting is None else Change()
    writes: dict[str, Any] = {cid: None}
    if read(summary_key(cid)):
        writes[summary_key(cid)] = None
    for i in range(head.items):
        item = read(item_key(cid, i))
        writes[item_key(cid, i)] = None
        if item and item.get("role") == "customer":
            writes[message_key(cid, item["id"])] = None
    for m in head.waiting_list():
        writes[message_key(cid, m["id"])] = None
    deleted = _event(f"deleted:{head.since}", "deleted", None, {"by": by})  # a stream forgets what it has shown
    return Change(writes=writes, effects=[DeleteRounds(head.rounds, head.since)], events=[deleted])


def idle(key: str, value: Any, *, now: float, idle_s: float) -> bool:
    """An entry of the table is a conversation's head, untouched for ``idle_s``, with no round answering."""
    return (SEP not in key and isinstance(value, dict) and value.get("answering") is None
            and isinstance(value.get("updated_at"), int | float) and value["updated_at"] < now - idle_s)


def message_view(read: Read, cid: str, message_id: str) -> dict[str, Any] | None:
    """A message's round and its reply (None until it is answered); None for a message never recorded."""
    known = read(message_key(cid, message_id))
    if not known:
        return None
    item = read(item_key(cid, known["reply"])) if known.get("reply") is not None else None
    return {"message_id": message_id, "round": known["round"], "reply": reply_of(item) if item else None}


def _event(event_id: str, kind: str, number: int | None, data: dict[str, Any]) -> dict[str, Any]:
    return {"id": event_id, "kind": kind, "round": number, "data": data}


def _dump(items: list[dict[str, Any]]) -> str:
    return json.dumps(items, separators=(",", ":"), ensure_ascii=False)
