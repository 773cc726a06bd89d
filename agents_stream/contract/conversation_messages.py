"""Conversation messages on the wire, a conversation's rounds, and the replies (docs/conversations.md).

A message shares its agent's task topic (``agent.tasks.<agent>``), keyed by ``conversation_id``, so one partition
holds a whole conversation and its one ledger sees its messages in order. A JSON object with a
``conversation_id`` is a message; any other is a task. Each message is answered by a *round*: a task the ledger
makes itself (never one a producer sends) whose task id ``round_task_id`` places it on its conversation's
partition, so every path that finds a task by its id (outcomes, heartbeats, reads forwarded to its owner) finds
the round beside its conversation.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agents_stream.contract import topics
from agents_stream.contract.errors import PoisonMessage
from agents_stream.contract.models import (
    NO_CONTROL,
    ROUND_PREFIX,
    SCHEMA_VERSION,
    ConversationContext,
    HistoryItem,
    utcnow_iso,
    validated,
)

__all__ = [
    "REPLIES", "ROUND_PREFIX", "ConversationAction", "ConversationContext", "ConversationDelete", "ConversationMessage",
    "ConversationReply", "HistoryItem", "conversation_of", "is_message", "message_digest", "message_from", "round_of",
    "round_task_id",
]

REPLIES = topics.REPLIES
#: ids people and programs choose: printable, short enough that a round's task id stays under 256 characters
ID_PATTERN = r"^[^\x00-\x1f\x7f]+$"
ID_MAX = 200
_RUN_SUFFIX = re.compile(r"^[0-9]+(\.[0-9]+)?$")


class ConversationMessage(BaseModel):
    """What a customer (or a program) writes in a conversation. Strict; unknown fields are ignored (evolution)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    schema_version: int = SCHEMA_VERSION
    conversation_id: str = Field(min_length=1, max_length=ID_MAX, pattern=ID_PATTERN)
    #: the same id sent again (a double click, a client's retry) is the same message: one reply
    message_id: str = Field(min_length=1, max_length=ID_MAX, pattern=ID_PATTERN)
    agent_name: str = Field(min_length=1)
    text: str = Field(min_length=1)
    context_data: dict[str, Any] = Field(default_factory=dict)
    #: who wrote it, as the sender names them (shown to the model and in the conversation's view)
    user: str | None = Field(default=None, max_length=200, pattern=NO_CONTROL)


class ConversationReply(BaseModel):
    """A round's answer to one or more messages of a conversation, keyed by conversation_id on ``agent.replies``."""

    model_config = ConfigDict(extra="ignore")

    schema_version: int = SCHEMA_VERSION
    conversation_id: str
    agent_name: str
    #: the messages this reply answers, in the order they arrived
    message_ids: list[str]
    round: int
    #: ``succeeded``, ``failed`` (the round failed: ``error`` says why) or ``rejected`` (a message that arrived
    #: while a round was answering, under the agent's ``double_texting = "reject"``)
    status: str
    text: str
    #: the round's task: its TaskResult (transcript, usage) is on agent.results under this id
    task_id: str | None = None
    error: str | None = None
    completed_at: str = Field(default_factory=utcnow_iso)
    #: a person's reply while the conversation was handed to them (docs/guide/handoff.md), and who wrote it
    human: bool = False
    operator: str | None = None
    #: "outage": this reply tells the customer a person takes over, because no provider could answer for the
    #: agent's ``handoff_after_s`` (docs/guide/handoff.md); None otherwise
    handoff: str | None = None


class ConversationDelete(BaseModel):
    """A request to delete a conversation, on its agent's task topic keyed by conversation_id (like its messages):
    every record of it is deleted once no round answers (docs/conversations.md, "Deleting")."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    schema_version: int = SCHEMA_VERSION
    conversation_id: str = Field(min_length=1, max_length=ID_MAX, pattern=ID_PATTERN)
    agent_name: str = Field(min_length=1)
    action: Literal["delete"]
    by: str = Field(min_length=1, max_length=200, pattern=NO_CONTROL)
    #: set by the idle sweep: delete only if the conversation was last changed at this time (nothing came since)
    idle_since: float | None = None


#: what a person does with a conversation (docs/guide/handoff.md): take it (or queue it for anyone), answer, give back
HANDOFF_ACTIONS = ("handoff", "reply", "handback", "escalate")


class ConversationAction(BaseModel):
    """An operator's action on a conversation, on its agent's task topic keyed by conversation_id (like its
    messages, so its ledger applies it in order with them). ``action_id`` makes a double click or a retry one
    action. ``text``: the reason of a handoff, the reply, or the hand-back note. ``escalate`` is no operator's: the
    worker's scan sends it when a conversation waiting for a person let its level's time run out."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    schema_version: int = SCHEMA_VERSION
    conversation_id: str = Field(min_length=1, max_length=ID_MAX, pattern=ID_PATTERN)
    agent_name: str = Field(min_length=1)
    action: Literal["handoff", "reply", "handback", "escalate"]
    action_id: str = Field(min_length=1, max_length=ID_MAX, pattern=ID_PATTERN)
    by: str = Field(min_length=1, max_length=200, pattern=NO_CONTROL)
    text: str = Field(default="", max_length=16_000)
    #: ``escalate`` (the scan's timer, tables/handoff_wait.py): the level whose time it saw run out
    level: int | None = Field(default=None, ge=0)


def is_message(data: Any) -> bool:
    """A decoded record is a conversation message (not a task) when it names a conversation."""
    return isinstance(data, dict) and "conversation_id" in data


def message_from(
    text: str, data: dict[str, Any], *, agent: str,
) -> ConversationMessage | ConversationDelete | ConversationAction:
    """A decoded message (``models.decode_record``: its text and its object) validated, or PoisonMessage with the
    reason; one with an ``action`` is a ConversationDelete, or an operator's ConversationAction."""
    model: type[BaseModel] = ConversationMessage
    if "action" in data:
        model = ConversationAction if data["action"] in HANDOFF_ACTIONS else ConversationDelete
    message: ConversationMessage | ConversationDelete | ConversationAction = validated(model, text)
    if message.agent_name != agent:
        raise PoisonMessage("agent_mismatch", f"agent_name {message.agent_name!r} sent to the topic of {agent!r}")
    return message


def message_digest(message: ConversationMessage) -> str:
    """Two messages under one message_id are the same message exactly when their digests agree (as task_digest:
    canonical JSON of every field but schema_version)."""
    fields = message.model_dump(mode="json", exclude={"schema_version"})
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def round_task_id(conversation_id: str, number: int, partitions: int, since: int) -> str:
    """The task id of round ``number`` of a conversation: ``conv:<conversation_id>@<since>#<number>``, with the
    shortest ``.<n>`` suffix that puts it on the conversation's partition (Kafka's partitioner hashes the whole id;
    about ``partitions`` ids are tried, deterministically, so every worker derives the same one). ``since`` is the
    offset of the message that began the conversation: a conversation deleted and begun again under the same id has
    other round ids, so its tools' idempotency keys never meet the deleted one's."""
    home = topics.partition_for(conversation_id.encode("utf-8"), partitions)
    base = f"{ROUND_PREFIX}{conversation_id}@{since}#{number}"
    for n in range(200 * partitions):
        candidate = base if n == 0 else f"{base}.{n}"
        if topics.partition_for(candidate.encode("utf-8"), partitions) == home:
            return candidate
    raise RuntimeError(f"no task id of round {number} of {conversation_id!r} falls on partition {home}")  # p ≈ e^-200


def round_of(task_id: str) -> tuple[str, int, int] | None:
    """(conversation_id, since, round) of a round's task id; None for any other task id (a round's sub-task too)."""
    if not task_id.startswith(ROUND_PREFIX) or "#" not in task_id:
        return None
    left, _, suffix = task_id[len(ROUND_PREFIX):].rpartition("#")
    conversation_id, _, since = left.rpartition("@")
    if not conversation_id or not since.isdigit() or not _RUN_SUFFIX.match(suffix):
        return None
    return conversation_id, int(since), int(suffix.split(".")[0])


def conversation_of(task_id: str) -> tuple[str, int] | None:
    """(conversation_id, round) of a round's task id; None for any other task id (a sub-task of a round included)."""
    found = round_of(task_id)
    return (found[0], found[2]) if found is not None else None
