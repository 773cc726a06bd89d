"""The shapes of the HTTP API's answers and of the bodies that have no event model of their own: the views build
their answers with these models (:func:`answer`) and agents_stream.ops.openapi publishes the same models as the
document's schemas, so the document cannot drift from what the views send.

Answers are open objects (``extra="allow"``): a field added to a view later is a compatible change, and a client
generated from the document keeps working. Request bodies that become an event are described by the event's own
model (agents_stream.ops.openapi picks the fields a body may carry from it).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Accepted", "ActionAccepted", "ApprovalsPage", "CircuitsView", "ConversationDeleteAccepted",
    "ConversationTokenBody", "ConversationView", "DeadLetterDetail", "DeadLetterRef", "DeadLettersPage",
    "DecisionAccepted", "DeskView", "Error", "HandoffInbox", "Health", "JobCancelAccepted", "JobView",
    "MessageAccepted", "MessageView", "NotReady", "Ready", "RecentView", "Requeued", "SamplesView",
    "TaskCancelAccepted", "TaskView", "TokenIssued", "answer",
]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


def answer(model: type[BaseModel], **fields: Any) -> dict[str, Any]:
    """``fields`` checked against ``model`` and returned as JSON-ready data, the keys given only (no defaults
    added): a view that strays from its documented answer fails here, in the tests, not in a client."""
    return model.model_validate(fields).model_dump(mode="json", exclude_unset=True)


class Error(_Answer):
    """Every refusal: what went wrong and what to do, said to the caller."""

    error: str


# -- probes --------------------------------------------------------------------------------------------------------


class Health(_Answer):
    status: Literal["ok"]
    worker: str


class Ready(_Answer):
    status: Literal["ready"]
    worker: str
    in_flight: int
    queued: int
    held: int
    providers_down: list[str]


class NotReady(_Answer):
    status: Literal["starting", "stopping"]


# -- reads ---------------------------------------------------------------------------------------------------------


class CircuitsView(_Answer):
    worker: str
    providers: dict[str, dict[str, Any]]


class TaskView(_Answer):
    task_id: str
    app_id: str
    state: str
    agent: str | None
    dispatch: int | None
    owner: str | None
    lease_until: float | None
    source: dict[str, Any]
    result: dict[str, Any] | None
    approval: dict[str, Any] | None
    cancel: dict[str, Any] | None
    progress: dict[str, Any] | None = None


class JobView(_Answer):
    job_id: str
    state: str


class ApprovalsPage(_Answer):
    worker: str
    awaiting: list[dict[str, Any]]
    count: int
    next: str | None
    unreachable: list[str] = Field(default_factory=list)


class DeadLettersPage(_Answer):
    dead_letters: list[dict[str, Any]]
    count: int
    next: str | None
    scanned: int
    retained: dict[str, int]
    total: int


class DeadLetterDetail(_Answer):
    ref: str
    agent: str | None
    task_id: str | None
    headers: dict[str, Any]
    history: list[Any]
    value: Any


class SamplesView(_Answer):
    worker: str
    interval_s: float
    history_s: float
    series: dict[str, list[Any]]
    breakers: dict[str, list[Any]]
    workers: list[str]
    unreachable: list[str]


class RecentView(_Answer):
    worker: str
    tasks: list[dict[str, Any]]
    jobs: list[dict[str, Any]]
    unreachable: list[str] = Field(default_factory=list)


class ConversationView(_Answer):
    conversation_id: str
    agent: str
    status: str
    rounds: int
    messages: int
    history: list[dict[str, Any]]
    next: int | None
    waiting: list[dict[str, Any]]
    round: dict[str, Any] | None


class MessageView(_Answer):
    conversation_id: str


class DeskView(_Answer):
    agent: str
    worker: str
    conversations: list[dict[str, Any]]
    unreachable: list[str]


class HandoffInbox(_Answer):
    worker: str
    conversations: list[dict[str, Any]]
    unreachable: list[str] = Field(default_factory=list)


# -- mutations: their answers, and the bodies no event model describes ---------------------------------------------


class Accepted(_Answer):
    accepted: Literal[True]


class DecisionAccepted(Accepted):
    task_id: str
    decision: Literal["approve", "reject", "cancel"]
    by: str


class TaskCancelAccepted(Accepted):
    task_id: str
    by: str


class JobCancelAccepted(Accepted):
    job_id: str
    by: str


class MessageAccepted(Accepted):
    conversation_id: str
    message_id: str
    partition: int
    offset: int


class ConversationDeleteAccepted(Accepted):
    conversation_id: str
    by: str


class ActionAccepted(Accepted):
    conversation_id: str
    action: Literal["handoff", "reply", "handback"]
    action_id: str
    by: str


class TokenIssued(_Answer):
    conversation_id: str
    token: str
    expires_at: int


class Requeued(_Answer):
    requeued: dict[str, Any]


class DeadLetterRef(BaseModel):
    """``POST /dlq/requeue``: the dead letter by its ``ref`` (as ``GET /dlq`` lists it), or by topic, partition and
    offset."""

    model_config = ConfigDict(extra="ignore")

    ref: str | None = Field(default=None, max_length=400)
    topic: str | None = Field(default=None, max_length=300)
    partition: int | None = Field(default=None, ge=0)
    offset: int | None = Field(default=None, ge=0)

    def as_ref(self) -> str:
        return self.ref or f"{self.topic}:{self.partition}:{self.offset}"


class ConversationTokenBody(BaseModel):
    """``POST /conversations/<id>/token``: how long the token lasts (clamped to 1 s .. 30 days)."""

    model_config = ConfigDict(extra="ignore")

    ttl_s: float | None = Field(default=None, allow_inf_nan=False)
