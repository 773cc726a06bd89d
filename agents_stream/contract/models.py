"""The JSON records on the topics: TaskPayload in, TaskResult and ControlEvent out."""

from __future__ import annotations

import hashlib
import json
import time
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents_stream.contract.errors import PoisonMessage

SCHEMA_VERSION = 1

RiskLevel = Literal["low", "medium", "high", "critical"]
Status = Literal["succeeded", "partial", "failed"]
Confidence = Literal["high", "medium", "low", "failed"]


def iso_utc(epoch_s: float) -> str:
    """``epoch_s`` (seconds since the epoch) as ISO-8601 UTC with milliseconds, e.g. 2026-12-01T10:00:00.000Z."""
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def utcnow_iso() -> str:
    return iso_utc(time.time())


#: an app id a parent may name: its outcomes topic (``agent.outcomes.<app id>``) must be a legal Kafka topic name
#: (ASCII letters, digits, ``.``, ``_``, ``-``; at most 249 characters), or the result's send could never succeed
APP_ID_PATTERN = r"^[A-Za-z0-9._-]+$"
APP_ID_MAX_LENGTH = 200


class ParentRef(BaseModel):
    """The agent loop a sub-task was delegated by: its result goes back to that task's ledger, at that call.

    Producer-written, so checked before anything acts on it (docs/security.md, "A task's parent"): the app id is a
    topic-name component, and the sub-task's own task_id must be ``sub_task_id(parent)`` (``parse_task``)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    task_id: str = Field(min_length=1)
    app_id: str = Field(min_length=1, max_length=APP_ID_MAX_LENGTH, pattern=APP_ID_PATTERN)
    call_id: str = Field(min_length=1)
    #: the agents of the chain of callers, outermost first (depth limit, cycle detection)
    lineage: list[str] = Field(default_factory=list)


def sub_task_id(task_id: str, call_id: str) -> str:
    """The task id of the sub-task call ``call_id`` of task ``task_id`` delegates: the one id its ``parent`` allows."""
    return f"{task_id}/{call_id}"


#: the task ids of conversation rounds begin with this (contract/conversation_messages); a producer's task may not
ROUND_PREFIX = "conv:"


class HistoryItem(BaseModel):
    """One earlier message (``customer``) or reply (``agent``) of a conversation, as a round shows it to the model;
    ``note``: what the person who held the conversation wrote to the agent when handing it back."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    role: str = Field(pattern=r"^(customer|agent|note)$")
    text: str


class SummaryInput(BaseModel):
    """A round's summary of its conversation's older history (docs/conversations.md, "Summaries"): the summary so
    far, and the items that fell out of the window since, to fold into it before the round's first model turn."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    #: the last summary stored with the conversation (None: none yet); it covers the items before ``upto``
    text: str | None = None
    upto: int = Field(default=0, ge=0)
    #: items of [upto, until) to fold into it, the newest of them within the agent's ``input_chars`` (none: the
    #: summary so far is shown as it is)
    items: list[HistoryItem] = Field(default_factory=list)
    #: the window's first item: what the new summary covers, items before it
    until: int = Field(default=0, ge=0)


class ConversationContext(BaseModel):
    """What a round's task carries of its conversation: whose it is, which messages it answers, the history before."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    conversation_id: str
    message_ids: list[str] = Field(min_length=1)
    history: list[HistoryItem] = Field(default_factory=list)
    #: the agent summarises older history (``[agents.<name>.summary]``): what its round starts from
    summary: SummaryInput | None = None


class TaskPayload(BaseModel):
    """A task for one sub-agent. Strict: no coercion; unknown fields are ignored (evolution)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    schema_version: int = SCHEMA_VERSION
    task_id: str = Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")  # no control characters
    agent_name: str = Field(min_length=1)
    instruction: str
    context_data: dict[str, Any] = Field(default_factory=dict)
    job_id: str | None = None
    priority: int | None = None
    risk_level: RiskLevel | None = None
    output_schema: dict[str, Any] | None = None
    steps: list[Any] | None = None
    deadline: str | None = None
    #: set on a sub-task an agent loop delegated (an agent used as a tool); absent on every other task
    parent: ParentRef | None = None
    #: set on a conversation's round (which the ledger makes, never a producer): its messages and the history before
    conversation: ConversationContext | None = None


def task_digest(task: TaskPayload) -> str:
    """A digest of the task's canonical fields (every field of TaskPayload but schema_version, as sorted compact
    JSON): two messages of one task_id are the same task exactly when their digests agree. Unknown fields, key
    order and whitespace do not count; an absent optional field equals its default."""
    fields = task.model_dump(mode="json", exclude={"schema_version"})
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class Usage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None


class TaskResult(BaseModel):
    """The one distinct outcome of a task_id, keyed by task_id on ``agent.results``."""

    model_config = ConfigDict(extra="ignore")

    schema_version: int = SCHEMA_VERSION
    task_id: str
    agent_name: str
    status: Status
    output: Any = None
    confidence: Confidence = "high"
    source: str = ""
    partial: bool = False
    attempts: int = 1
    usage: Usage = Field(default_factory=Usage)
    job_id: str | None = None
    error: str | None = None
    completed_at: str = Field(default_factory=utcnow_iso)
    #: an agent loop's turns and tool calls, with the usage of every model call (absent for other tasks)
    transcript: dict[str, Any] | None = None

    def to_json(self) -> str:
        """The record's JSON: ``transcript`` only when there is one, so other results keep their bytes."""
        return self.model_dump_json(exclude=None if self.transcript is not None else {"transcript"})


class ControlEvent(BaseModel):
    """Something an operator or another service should know: held, released, dead-lettered, alerts."""

    model_config = ConfigDict(extra="ignore")

    schema_version: int = SCHEMA_VERSION
    event: str
    subject: str
    agent_name: str | None = None
    worker: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    at: str = Field(default_factory=utcnow_iso)


#: text with no C0/C1 control characters or DEL (names, comments and reasons people type)
NO_CONTROL = r"^[^\x00-\x1f\x7f-\x9f]*$"


class ApprovalDecision(BaseModel):
    """A human's decision on a task awaiting approval, keyed by task_id on ``agent.approvals``."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    schema_version: int = SCHEMA_VERSION
    task_id: str = Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")
    #: ``cancel`` ends the task whatever it waits for (running, parked, waiting for sub-tasks: tables/cancel.py);
    #: approve and reject decide a task awaiting approval
    decision: Literal["approve", "reject", "cancel"]
    #: who decided (a person, or the approval level a signed link was sent to); no control characters, so it
    #: cannot rewrite a terminal or a log line it is printed in
    by: str = Field(min_length=1, max_length=200, pattern=NO_CONTROL)
    #: how it arrived: "http", "link", "cli" or "event"
    via: str = Field(default="event", max_length=20, pattern=NO_CONTROL)
    comment: str | None = Field(default=None, max_length=2000, pattern=NO_CONTROL)
    #: the app id whose task this decides: every app id reads agent.approvals, and two of them may hold the same
    #: task id; only this one applies it. Required on approve and reject (tables/approvals.binding_problem); on a
    #: cancel it may be absent only when the cancel names the agent (a caller's cancel of its sub-tasks)
    app_id: str | None = Field(default=None, min_length=1, max_length=249, pattern=NO_CONTROL)
    #: the task's agent: required on approve and reject, checked against the task's. A signed cancel naming it is
    #: also recorded by the apps that run that agent before the task arrived, so a task still in its topic never runs
    agent: str | None = Field(default=None, min_length=1, max_length=200, pattern=NO_CONTROL)
    #: a signed link's level (optional elsewhere) and the parking decided (``notify.parked_ms``, required on approve
    #: and reject): the decision counts only for that parking, so a retried decision cannot decide the next one
    level: int | None = Field(default=None, ge=0, le=1000)
    parked: int | None = Field(default=None, ge=0)
    #: the sender's signature (``notify.decision_signature``): workers, links and the CLI sign with the approval
    #: secret; a decision without a valid one is recorded as ``signed: false``
    sig: str | None = Field(default=None, max_length=128)


def parse_json_model(raw: bytes | None, model: type[BaseModel], max_bytes: int) -> Any:
    """Decode a JSON record into ``model``, or raise PoisonMessage with the reason (the same reasons as tasks)."""
    if raw is None:
        raise PoisonMessage("null_value", "the message has no value (tombstone)")
    if len(raw) > max_bytes:
        raise PoisonMessage("payload_too_large", f"{len(raw)} bytes > limit {max_bytes}")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors())
        kind = "not_json" if any(e["type"] == "json_invalid" for e in exc.errors()) else "schema_violation"
        raise PoisonMessage(kind, problems) from None


def decode_record(raw: bytes | None, max_bytes: int) -> tuple[str, dict[str, Any]]:
    """A record's text and its JSON object, or PoisonMessage with the reason (null, too large, not UTF-8, not
    JSON, not an object): layer 1 (docs/contract.md, "Error layers"), the same for tasks and conversation messages."""
    if raw is None:
        raise PoisonMessage("null_value", "the message has no value (tombstone)")
    if len(raw) > max_bytes:
        raise PoisonMessage("payload_too_large", f"{len(raw)} bytes > limit {max_bytes}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PoisonMessage("invalid_utf8", str(exc)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PoisonMessage("not_json", str(exc)) from None
    except RecursionError:
        raise PoisonMessage("not_json", "nested too deeply to decode") from None
    if not isinstance(data, dict):
        raise PoisonMessage("schema_violation", f"expected a JSON object, got {type(data).__name__}")
    return text, data


def validated(model: type[BaseModel], text: str) -> Any:
    """``text`` validated as ``model``, or PoisonMessage("schema_violation") naming every problem."""
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()
        )
        raise PoisonMessage("schema_violation", problems) from None


def parse_task(raw: bytes | None, *, agent: str, max_bytes: int, max_steps: int | None = None) -> TaskPayload:
    """Decode and validate a task message, or raise PoisonMessage with the reason.

    Layer 1 (docs/contract.md, "Error layers"): every way a message can be unusable has its own reason.
    ``max_steps`` bounds ``steps``
    (AGENTS_STREAM_MAX_STEPS): each step's answer is kept in the task's record, which must stay one Kafka record.
    """
    text, _ = decode_record(raw, max_bytes)
    return task_from(text, agent=agent, max_steps=max_steps)


def task_from(text: str, *, agent: str, max_steps: int | None = None) -> TaskPayload:
    """A decoded task message validated (``parse_task`` after ``decode_record``)."""
    task: TaskPayload = validated(TaskPayload, text)
    if max_steps is not None and task.steps is not None and len(task.steps) > max_steps:
        raise PoisonMessage("too_many_steps", f"{len(task.steps)} steps > AGENTS_STREAM_MAX_STEPS {max_steps}")
    if task.agent_name != agent:
        raise PoisonMessage(
            "agent_mismatch", f"agent_name {task.agent_name!r} sent to the topic of {agent!r}"
        )
    if task.conversation is not None or (task.parent is None and task.task_id.startswith(ROUND_PREFIX)):
        # A round is made by the ledger from its conversation's messages: a producer's copy would answer for it.
        raise PoisonMessage(
            "reserved_task_id", f"task ids beginning with {ROUND_PREFIX!r} and the field 'conversation' belong to "
            "conversation rounds, which the worker makes itself: send a conversation message instead",
        )
    if task.parent is not None:
        derived = sub_task_id(task.parent.task_id, task.parent.call_id)
        if task.task_id != derived:  # a parent the task's own id does not carry is not its caller's
            raise PoisonMessage(
                "parent_mismatch", f"a sub-task of {task.parent.task_id!r} at call {task.parent.call_id!r} has the "
                f"task_id {derived!r}, not {task.task_id!r}",
            )
    return task
