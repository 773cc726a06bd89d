"""A conversation's state machine: its messages, its rounds and their replies (pure, clock passed in).

One record per conversation_id in the ``conversations`` table. A message that arrives while no round is open starts
round n+1, which answers every message not yet answered; one that arrives while a round is open waits for the next
round (``enqueue``) or is answered at once with a refusal (``reject``), per the agent's ``double_texting``. A round's
end records its reply and starts the next round when messages wait. Every transition is idempotent: the ledger may
apply the same message or the same round's end again after a crash (docs/conversations.md, "Crashes").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from agents_stream.tables.records import JsonRecord

RECORD_VERSION = 1

ENQUEUE = "enqueue"
REJECT = "reject"

#: the reply a message gets when it arrives while a round is answering and its agent rejects double texting
REJECTED_TEXT = (
    "I am still answering your earlier message, so this one was not taken; send it again once you have my answer."
)


@dataclass(frozen=True)
class ConversationRecord(JsonRecord):
    """What the conversations table stores per conversation_id (versioned JSON)."""

    agent: str
    #: JSON list, in arrival order, of {id, digest, text, user, context, at, round}: ``round`` is the round that
    #: answers the message (None while it waits for one; the open round's number while a rejection answers it)
    messages: str = "[]"
    #: JSON list, in the order they were made, of {round, message_ids, status, text, task_id, error, completed_at}
    replies: str = "[]"
    #: how many rounds were started
    rounds: int = 0
    #: the round answering now, or None (idle)
    answering: int | None = None
    updated_at: float = 0.0
    v: int = RECORD_VERSION

    @property
    def status(self) -> str:
        return "idle" if self.answering is None else "answering"

    def message_list(self) -> list[dict[str, Any]]:
        return list(json.loads(self.messages))

    def reply_list(self) -> list[dict[str, Any]]:
        return list(json.loads(self.replies))

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


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


Effect = StartRound | SendReply | Refuse


def _dump(items: list[dict[str, Any]]) -> str:
    return json.dumps(items, separators=(",", ":"), ensure_ascii=False)


def receive(
    record: ConversationRecord | None, *, agent: str, message: dict[str, Any], policy: str, now: float,
) -> tuple[ConversationRecord | None, list[Effect]]:
    """A message arrived: ``message`` has id, digest, text, user and context. Returns the new record (the same
    object when nothing changes) and the effects."""
    if record is not None and record.agent != agent:
        return record, [Refuse(
            "conversation_agent_mismatch",
            f"conversation belongs to agent {record.agent!r}; a message for {agent!r} cannot join it",
        )]
    record = record or ConversationRecord(agent=agent, updated_at=now)
    messages = record.message_list()
    known = next((m for m in messages if m["id"] == message["id"]), None)
    if known is not None:
        if known["digest"] != message["digest"]:
            return record, [Refuse(
                "message_conflict", f"message_id {message['id']!r} was sent before with other content",
            )]
        reply = _reply_of(record, message["id"])
        if reply is not None:
            return record, [SendReply(reply)]  # a duplicate: its reply again
        answering = record.answering
        if answering is not None and known["round"] == answering:
            # Its round again (idempotent): after a crash the round's task may never have been written.
            return record, [StartRound(answering, tuple(m["id"] for m in round_messages(record, answering)))]
        return record, []  # enqueued: the next round answers it
    entry = {**message, "at": now, "round": None}
    if record.answering is not None and policy == REJECT:
        entry["round"] = record.answering
        reply = {"round": record.answering, "message_ids": [message["id"]], "status": "rejected",
                 "text": REJECTED_TEXT, "task_id": None, "error": None, "completed_at": now}
        new = replace(record, messages=_dump(messages + [entry]), replies=_dump(record.reply_list() + [reply]),
                      updated_at=now)
        return new, [SendReply(reply)]
    new = replace(record, messages=_dump(messages + [entry]), updated_at=now)
    if new.answering is not None:
        return new, []  # enqueued: the next round answers it
    return _start_next(new, now)


def round_ended(
    record: ConversationRecord | None, *, number: int, status: str, text: str, task_id: str, error: str | None,
    completed_at: float, now: float,
) -> tuple[ConversationRecord | None, list[Effect]]:
    """Round ``number`` ended with ``text`` (or ``error``). Applied again (a redelivery), it changes nothing."""
    if record is None or record.answering != number:
        return record, []
    messages = record.message_list()
    answered = [m["id"] for m in messages if m["round"] == number and _reply_of(record, m["id"]) is None]
    reply = {"round": number, "message_ids": answered, "status": status, "text": text, "task_id": task_id,
             "error": error, "completed_at": completed_at}
    new = replace(record, replies=_dump(record.reply_list() + [reply]), answering=None, updated_at=now)
    started, effects = _start_next(new, now)
    return started, [SendReply(reply), *effects]


def _start_next(record: ConversationRecord, now: float) -> tuple[ConversationRecord, list[Effect]]:
    """Start the next round for the messages no round answers yet (none waiting: the record as it is)."""
    messages = record.message_list()
    waiting = [m for m in messages if m["round"] is None]
    if not waiting:
        return record, []
    number = record.rounds + 1
    for m in waiting:
        m["round"] = number
    new = replace(record, messages=_dump(messages), rounds=number, answering=number, updated_at=now)
    return new, [StartRound(number, tuple(m["id"] for m in waiting))]


def _reply_of(record: ConversationRecord, message_id: str) -> dict[str, Any] | None:
    return next((r for r in record.reply_list() if message_id in r["message_ids"]), None)


def round_messages(record: ConversationRecord, number: int) -> list[dict[str, Any]]:
    """The messages round ``number`` answers, in arrival order (a rejected message is not one of them)."""
    rejected = {i for r in record.reply_list() if r["status"] == "rejected" for i in r["message_ids"]}
    return [m for m in record.message_list() if m["round"] == number and m["id"] not in rejected]


def history(record: ConversationRecord, limit: int) -> list[dict[str, str]]:
    """What came before the open round, oldest first, at most the last ``limit`` items: each reply after the
    messages it answers, the replies in the order their first message arrived."""
    order = {m["id"]: i for i, m in enumerate(record.message_list())}
    texts = {m["id"]: m["text"] for m in record.message_list()}
    replies = sorted(record.reply_list(), key=lambda r: min((order[i] for i in r["message_ids"]), default=0))
    items: list[dict[str, str]] = []
    for reply in replies:
        items += [{"role": "customer", "text": texts[i]} for i in reply["message_ids"]]
        items.append({"role": "agent", "text": reply["text"]})
    return items[-limit:] if limit > 0 else []
