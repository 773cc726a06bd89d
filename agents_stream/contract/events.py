"""Typed internal events: the records only our workers write (outcomes, cache, job events, circuits) and their codec.

Four topic families, each a union discriminated by ``kind``::

    OUTCOMES    agent.outcomes.<app>, keyed by task_id (or a poison marker)
                TaskSucceeded | TaskFailed | Heartbeat | StepDone | JournalEntry | CallParked | CallsDelegated
                | SubtaskResult | ApprovalTimeout | LeaseExpired | CacheReply | DeadLetterRequest | DeadLettered
                (a JournalEntry is kind "step" on the wire, as a StepDone: contract/checkpoints.py)
    ANSWERS     agent.answers.<app>, keyed by fingerprint      CacheLookup | CacheStore
    JOB_EVENTS  agent.job.events, keyed by job_id              JobTaskResult | JobDeadline
    CIRCUITS    agent.circuits, keyed by provider or worker    CircuitHello | CircuitTransition | CircuitFailure
                | CircuitSuccess | CircuitProbe | CircuitProbeCancel | CircuitRateLimited

``encode(event)`` writes the keys and values the previous version wrote (so
both versions share the topics); ``decode(raw, family)`` raises ``EventDecodeError`` on
anything else, so a reader logs and skips it (``read_event`` does both). Anything else includes
NaN, Infinity and numbers too large for a float (not JSON; they poison sums) and records nested deeper than
``MAX_DEPTH`` (deeper than the ledger can store and re-read them).
A field every producer sends is required; a field that may be absent defaults
to None, which means "absent" and nothing else.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Generic, Literal, Protocol, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, ValidationError, field_serializer

from agents_stream.contract.checkpoints import JOURNAL_TAG, JournalEntry, StepDone, outcome_tag
from agents_stream.contract.circuit_records import (
    CircuitFailure,
    CircuitHello,
    CircuitProbe,
    CircuitProbeCancel,
    CircuitRateLimited,
    CircuitsEvent,
    CircuitSuccess,
    CircuitTransition,
)
from agents_stream.contract.envelope import EventDecodeError, InternalEvent
from agents_stream.contract.jsonsafe import MAX_DEPTH, nesting_depth, strict_json
from agents_stream.contract.models import SCHEMA_VERSION, Confidence, Status, Usage

__all__ = [
    "ANSWERS", "CALL_ID_PATTERN", "CIRCUITS", "JOB_EVENTS", "OUTCOMES",
    "AnswersEvent", "CacheLookup", "CacheReply", "CacheStore", "CachedAnswer", "CallParked", "CallsDelegated",
    "CircuitFailure", "CircuitHello", "DelegatedCall", "SubtaskResult",
    "CircuitProbe", "CircuitProbeCancel", "CircuitRateLimited", "CircuitSuccess", "CircuitTransition", "CircuitsEvent",
    "DeadLetterRequest", "DeadLettered", "EventDecodeError", "Family", "FannedInResult", "Heartbeat",
    "InternalEvent", "ApprovalTimeout", "JobDeadline", "JobEvent", "JobTaskResult", "JournalEntry", "LeaseExpired",
    "OutcomeEvent",
    "RecordsExpired", "StepDone", "TaskFailed", "TaskSucceeded", "Where", "decode", "decode_answer", "encode",
    "encode_answer",
    "read_event",
]

log = logging.getLogger(__name__)


class _Versioned(InternalEvent):
    """The envelope of the outcomes, answers and job-events topics."""

    schema_version: int = SCHEMA_VERSION
    kind: str


# -- agent.outcomes.<app>: the executor, the lease scanner and the cache tell the ledger -----------------------


class TaskSucceeded(_Versioned):
    """A task's answer (``status`` "partial" is the explicit no-provider answer, with ``error``)."""

    OMIT_IF_NONE: ClassVar[frozenset[str]] = frozenset({"error", "cached_at", "transcript"})

    kind: Literal["succeeded"] = "succeeded"
    worker: str
    dispatch: int
    calls: int
    usage: Usage
    route: str | None  # always sent; null when the task took no routing decision
    status: Literal["succeeded", "partial"]
    output: Any
    confidence: Confidence
    source: str
    partial: bool
    error: str | None = None  # only a partial answer says why
    cached_at: float | None = None  # only an answer from the last-good-answer cache
    transcript: dict[str, Any] | None = None  # only an agent loop's: its turns and tool calls


class TaskFailed(_Versioned):
    """A task no provider can answer (rejected, invalid output, compensated saga): it is dead-lettered.
    It has no status, output or confidence on the wire: the ledger's result says "failed" for all three."""

    OMIT_IF_NONE: ClassVar[frozenset[str]] = frozenset({"transcript"})

    kind: Literal["failed"] = "failed"
    worker: str
    dispatch: int
    calls: int
    usage: Usage
    route: str | None
    error: str
    reason: str
    source: str
    transcript: dict[str, Any] | None = None  # only an agent loop's: its turns and tool calls


class Heartbeat(_Versioned):
    """The executor running dispatch ``dispatch`` is alive: extend the lease (sent without confirmation)."""

    kind: Literal["heartbeat"] = "heartbeat"
    worker: str
    dispatch: int
    owner: str


class CallParked(_Versioned):
    """An agent loop's tool call waits for a human: park the task at that call, its journal kept."""

    kind: Literal["call_parked"] = "call_parked"
    worker: str
    dispatch: int
    turn: int
    call_id: str
    tool: str
    reason: str


#: what a delegated call's id may be: it becomes part of a task_id
CALL_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"


class DelegatedCall(BaseModel):
    """One call of an agent tool, as its sub-task will carry it (the agent name as the config allows it)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str = Field(pattern=CALL_ID_PATTERN)  # part of the sub-task's id: <task_id>/<id>
    agent: str = Field(pattern=r"^[A-Za-z0-9_-]+$")
    instruction: str
    context: dict[str, Any] | None = None


class CallsDelegated(_Versioned):
    """An agent loop's calls to other agents: publish them as sub-tasks and park the task until every result is
    back. A malformed call makes the whole event malformed (logged and skipped), never a stream-loop error."""

    kind: Literal["delegated"] = "delegated"
    worker: str
    dispatch: int
    turn: int
    calls: list[DelegatedCall] = Field(min_length=1)
    #: the traceparent of the run that delegated (ops/tracing.py): the sub-agent calls' spans hang under it
    trace: str | None = None

    OMIT_IF_NONE: ClassVar[frozenset[str]] = frozenset({"trace"})


class SubtaskResult(_Versioned):
    """A delegated sub-task's result, sent by whichever ledger finished it to its parent's outcomes topic."""

    kind: Literal["subtask_result"] = "subtask_result"
    task_id: str  # the sub-task's
    agent: str
    call_id: str
    result: dict[str, Any]
    #: contract.models.task_digest of the sub-task that ran (the caller compares it with the payload it sent);
    #: None from a worker of an older version
    digest: str | None = None

    OMIT_IF_NONE: ClassVar[frozenset[str]] = frozenset({"digest"})


class ApprovalTimeout(_Versioned):
    """The lease scanner saw approval level ``level`` of a parked task time out: escalate."""

    kind: Literal["approval_timeout"] = "approval_timeout"
    level: int
    worker: str


class LeaseExpired(_Versioned):
    """The lease scanner saw the lease of ``dispatch`` lapse: re-dispatch (or give up).

    ``released``: sent by the run of ``dispatch`` itself, which stopped without an outcome because its task's
    partition is no longer its worker's (it was fenced): the partition's owner takes the task over at once.
    ``interrupted``: it stopped at a safe point for a conversation's new message (contract.errors.Interrupted)."""

    OMIT_IF_NONE: ClassVar[frozenset[str]] = frozenset({"released", "interrupted"})

    kind: Literal["expired"] = "expired"
    dispatch: int
    worker: str
    released: bool | None = None
    interrupted: bool | None = None


class RecordsExpired(_Versioned):
    """The expiry sweep found these task-table entries past their time to live on the partition of this event (its
    key is the first of them): the ledger tombstones each one that still is (ledger/expiry_sweep.py)."""

    kind: Literal["records_expired"] = "records_expired"
    keys: list[str] = Field(min_length=1, max_length=10_000)
    worker: str


class CachedAnswer(BaseModel):
    """A last good answer as the answers table keeps it (and a cache reply carries it): not an event, no kind."""

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    task_id: str
    output: Any
    source: str
    confidence: Confidence
    at: float


class CacheReply(_Versioned):
    """The cache's partition answers a lookup: the last good answer, or None for a miss."""

    kind: Literal["cache_reply"] = "cache_reply"
    dispatch: int
    worker: str
    answer: CachedAnswer | None


class DeadLetterRequest(_Versioned):
    """A worker asks (through the poison message's partition) to dead-letter it; keyed by the poison marker."""

    kind: Literal["dead_letter"] = "dead_letter"


class DeadLettered(_Versioned):
    """A poison message's dead letter is confirmed: the ledger writes its marker; keyed by the poison marker."""

    kind: Literal["dead_lettered"] = "dead_lettered"


# Tagged by kind, except the journal entry: it shares kind "step" with the step checkpoint (checkpoints.outcome_tag).
OutcomeEvent = Annotated[
    Union[
        Annotated[TaskSucceeded, Tag("succeeded")], Annotated[TaskFailed, Tag("failed")],
        Annotated[Heartbeat, Tag("heartbeat")], Annotated[StepDone, Tag("step")],
        Annotated[JournalEntry, Tag(JOURNAL_TAG)], Annotated[CallParked, Tag("call_parked")],
        Annotated[CallsDelegated, Tag("delegated")], Annotated[SubtaskResult, Tag("subtask_result")],
        Annotated[ApprovalTimeout, Tag("approval_timeout")], Annotated[LeaseExpired, Tag("expired")],
        Annotated[CacheReply, Tag("cache_reply")], Annotated[DeadLetterRequest, Tag("dead_letter")],
        Annotated[DeadLettered, Tag("dead_lettered")], Annotated[RecordsExpired, Tag("records_expired")],
    ],
    Discriminator(outcome_tag),
]


# -- agent.answers.<app>: the last-good-answer cache, keyed by fingerprint ---------------------------------------


class CacheLookup(_Versioned):
    """An executor asks for the last good answer of a fingerprint; the reply goes to ``task_id`` as an outcome."""

    kind: Literal["lookup"] = "lookup"
    task_id: str
    dispatch: int


class CacheStore(_Versioned):
    """The ledger stores a good (high or medium confidence) answer under its fingerprint."""

    kind: Literal["store"] = "store"
    task_id: str
    output: Any
    source: str
    confidence: Confidence
    at: float

    def answer(self) -> CachedAnswer:
        return CachedAnswer(
            task_id=self.task_id, output=self.output, source=self.source, confidence=self.confidence, at=self.at,
        )


AnswersEvent = Annotated[Union[CacheLookup, CacheStore], Field(discriminator="kind")]


# -- agent.job.events: fan-in to the orchestrator, keyed by job_id ---------------------------------------------


class FannedInResult(BaseModel):
    """A job task's result: a whole TaskResult, or {task_id, status: failed, error} when none will come.
    Every other field rides along unchanged (the fan-in is a copy of the result record)."""

    model_config = ConfigDict(frozen=True, extra="allow", strict=True)

    task_id: str
    status: Status
    output: Any = None
    confidence: Confidence | None = None  # None: absent (a result that never came: dead-lettered, too large)
    source: str | None = None  # None: absent, as confidence
    error: str | None = None


class JobTaskResult(_Versioned):
    """The result of one of a job's tasks, for the job's owner."""

    OMIT_IF_NONE: ClassVar[frozenset[str]] = frozenset({"agent_name", "task_digest"})

    kind: Literal["result"] = "result"
    result: FannedInResult
    #: who the ledger recorded the task for, and its task's digest (contract.models.task_digest): the job counts
    #: the result only for the task it dispatched. None from workers that predate the digest (then not checked).
    agent_name: str | None = None
    task_digest: str | None = None

    @field_serializer("result")
    def _as_sent(self, result: FannedInResult) -> dict[str, Any]:
        # The stub of a result that never came has no output, confidence or source: keep them absent.
        return result.model_dump(mode="json", exclude_unset=True)


class JobDeadline(_Versioned):
    """The lease scanner saw a job's deadline pass: end it."""

    kind: Literal["deadline"] = "deadline"
    worker: str


JobEvent = Annotated[Union[JobTaskResult, JobDeadline], Field(discriminator="kind")]


# -- encoding and decoding ---------------------------------------------------------------------------------

E = TypeVar("E")


@dataclass(frozen=True)
class Family(Generic[E]):
    """The events one topic carries: ``decode(raw, family)`` accepts exactly these kinds."""

    name: str
    adapter: TypeAdapter[E]
    kinds: frozenset[str]


def _family(name: str, union: Any) -> Family[Any]:
    members = [get_args(m)[0] if get_origin(m) is Annotated else m for m in get_args(get_args(union)[0])]
    return Family(name, TypeAdapter(union), frozenset(m.model_fields["kind"].default for m in members))


OUTCOMES: Family[OutcomeEvent] = _family("outcome", OutcomeEvent)
ANSWERS: Family[AnswersEvent] = _family("cache", AnswersEvent)
JOB_EVENTS: Family[JobEvent] = _family("job", JobEvent)
CIRCUITS: Family[CircuitsEvent] = _family("circuits", CircuitsEvent)


def _dump(event: BaseModel) -> dict[str, Any]:
    data = event.model_dump(mode="json")
    omit: frozenset[str] = getattr(event, "OMIT_IF_NONE", frozenset())
    return {k: v for k, v in data.items() if not (v is None and k in omit)}


def encode(event: InternalEvent) -> bytes:
    """The record's value: the same JSON keys and values the producers of the previous version wrote."""
    return json.dumps(_dump(event)).encode()


def encode_answer(answer: CachedAnswer) -> str:
    """A last good answer as the answers table stores it (the five keys, no kind)."""
    return json.dumps(answer.model_dump(mode="json"))


def decode(raw: bytes | str | None, family: Family[E]) -> E:
    """The event in ``raw``, of one of ``family``'s kinds; EventDecodeError for anything else."""
    try:
        data = strict_json(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError, RecursionError) as exc:  # None, not UTF-8, not JSON, nested too deeply
        raise EventDecodeError(family.name, f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise EventDecodeError(family.name, f"expected a JSON object, got {type(data).__name__}")
    if nesting_depth(data, MAX_DEPTH) > MAX_DEPTH:
        raise EventDecodeError(family.name, f"nested deeper than {MAX_DEPTH} levels")
    kind = data.get("kind")
    if not isinstance(kind, str):
        raise EventDecodeError(family.name, "no kind" if kind is None else f"kind is a {type(kind).__name__}")
    if kind not in family.kinds:
        raise EventDecodeError(family.name, f"unknown kind {kind!r}", kind=kind, unknown_kind=True)
    try:
        return family.adapter.validate_python(data, strict=True)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or '<root>'}: {e['msg']}" for e in exc.errors())
        raise EventDecodeError(family.name, f"{kind}: {problems}", kind=kind) from None


def decode_answer(raw: bytes | str) -> CachedAnswer:
    """A last good answer from the answers table; EventDecodeError when it is not one."""
    try:
        return CachedAnswer.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        raise EventDecodeError("cache", f"not a cached answer ({exc.error_count()} problems)") from None


class Where(Protocol):
    """Where a record was read (faust's TP)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...


def read_event(
    where: Where, offset: int, key: bytes | None, value: bytes | None, family: Family[E],
) -> tuple[str, E] | None:
    """(key, event) of a record only our workers write, or None (logged) for a broken one: it carries no
    work to lose, so it is skipped rather than dead-lettered."""
    try:
        subject = key.decode("utf-8")  # type: ignore[union-attr]
    except (AttributeError, UnicodeDecodeError) as exc:
        log.warning("Skipping %s event without a usable key at %s[%d]@%d: %r",
                    family.name, where.topic, where.partition, offset, exc)
        return None
    try:
        return subject, decode(value, family)
    except EventDecodeError as exc:
        if exc.unknown_kind:
            log.warning("Skipping %s event of unknown kind %r for %s at %s[%d]@%d (a newer worker's?)",
                        family.name, exc.kind, subject, where.topic, where.partition, offset)
        else:
            log.warning("Skipping malformed %s event at %s[%d]@%d: %s",
                        family.name, where.topic, where.partition, offset, exc.reason)
        return None
