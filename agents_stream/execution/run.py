"""A task while this worker runs it (Run), what one rung of its ladder came to, and the outcome events it ends with."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from agents_stream.contract.checkpoints import JournalEntry
from agents_stream.contract.events import TaskFailed, TaskSucceeded, encode
from agents_stream.contract.models import Confidence, TaskPayload, Usage
from agents_stream.kafka.delivery import RECORD_OVERHEAD_BYTES
from agents_stream.providers.conversation import Turn

__all__ = [
    "Answer", "Rejected", "Run", "TurnAnswer", "Unavailable", "common", "partial", "rejected", "succeeded", "too_large",
    "within",
]

log = logging.getLogger(__name__)


@dataclass
class Run:
    """One dispatch of a task on this worker's executor, queued, running or held (not an orchestrator job)."""

    task: TaskPayload
    dispatch: int
    worker: str  # this worker's id: every outcome it sends names it
    started: float | None = None
    held: bool = False
    #: since when (time.monotonic) it is held: an outage past its agent's ``handoff_after_s`` hands a round to a
    #: person (execution/outage.py); a new dispatch (after a kill) starts the wait again
    held_since: float | None = None
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None
    route: str = ""
    #: an answer the router's tier gave before escalating: used if the rest of the ladder is down
    escalated: Answer | None = None
    #: held: how long to stay held before trying again (seconds)
    wait: float = 0.0
    #: a multi-step task: the outputs of the steps done (from the checkpoint, then this run)
    steps_done: list[Any] = field(default_factory=list)
    #: the lowest confidence and the last source over the steps done in this run
    steps_confidence: Confidence = "high"
    done: asyncio.Event = field(default_factory=asyncio.Event)
    #: the task was cancelled (its record says so): nothing more of this run counts, and it sends no outcome
    cancelled: bool = False
    #: a conversation's new message asks the round to stop at its next safe point (Executor.interrupt)
    interrupted: bool = False
    #: the ladder, loop or steps running it in a call slot now (what a cancel stops)
    work: asyncio.Future[Any] | None = None
    #: the traceparent its spans hang under (its dispatch's span, ops/tracing.py); None: not traced
    trace: str | None = None
    #: while held and traced: the span of the hold (ended when it is released)
    hold_span: Any = None
    #: the id the group's coordinator knew this worker by when the task was dispatched here (None: unknown); a run
    #: acts only while it still does (execution/membership.py)
    member: str | None = None
    #: when (the membership's monotonic clock) it was dispatched here: a stall after it may have made it stale
    dispatched_at: float | None = None
    #: the final answer's journal entry, held back by the agent loop (``Loop.final_entry``): the executor sends it
    #: just ahead of the final outcome, so the ledger writes both to the task's record at once
    final_entry: JournalEntry | None = None


# What one rung of the ladder came to.
@dataclass
class Answer:
    output: Any
    confidence: Confidence
    source: str


@dataclass(frozen=True)
class TurnAnswer:
    """One model turn of an agent loop and where it came from (``source`` its rung: "primary:openai:gpt-4o")."""

    turn: Turn
    source: str
    confidence: Confidence
    provider_calls: int
    cost: float | None


@dataclass
class Unavailable:
    retry_at: float | None
    why: str


@dataclass
class Rejected:
    """The task's own fault: a failed result and a dead letter."""

    reason: str
    error: str
    source: str


def common(run: Run) -> dict[str, Any]:
    """The fields every terminal outcome of ``run`` carries (keyword arguments of TaskSucceeded and TaskFailed)."""
    return {
        "worker": run.worker,
        "dispatch": run.dispatch,
        "calls": run.calls,
        "usage": Usage(input_tokens=run.input_tokens, output_tokens=run.output_tokens, cost=run.cost),
        "route": run.route.strip() or None,
    }


def succeeded(run: Run, answer: Answer, cached_at: float | None = None) -> TaskSucceeded:
    return TaskSucceeded(
        **common(run), status="succeeded", output=answer.output, confidence=answer.confidence, source=answer.source,
        partial=False, cached_at=cached_at,
    )


def rejected(run: Run, rejection: Rejected) -> TaskFailed:
    log.warning(
        "Task %s failed at %s: %s (dead-lettered, error_layer=downstream)",
        run.task.task_id, rejection.source, rejection.error,
    )
    return TaskFailed(**common(run), error=rejection.error, reason=rejection.reason, source=rejection.source)


def partial(run: Run) -> TaskSucceeded:
    log.warning(
        "Task %s: every tier unavailable; answering with the explicit partial result (lowest = failed)",
        run.task.task_id,
    )
    return TaskSucceeded(
        **common(run), status="partial", output=None, confidence="failed", source="none", partial=True,
        error="every provider of the agent was unavailable",
    )


def too_large(run: Run, answer_bytes: int, limit: int, source: str) -> TaskFailed | None:
    """The failure (``result_too_large``) of a run whose answer of ``answer_bytes`` would not fit, with the task's
    payload, in one record of ``limit`` bytes (AGENTS_STREAM_RECORD_MAX_BYTES); None when it fits."""
    size = answer_bytes + len(run.task.model_dump_json()) + RECORD_OVERHEAD_BYTES
    if size <= limit:
        return None
    error = (
        f"result_too_large: the answer ({answer_bytes} bytes) and the task make a record of about {size} bytes "
        f"> AGENTS_STREAM_RECORD_MAX_BYTES {limit}"
    )
    return rejected(run, Rejected(error, error, source))


def within(run: Run, outcome: TaskSucceeded | TaskFailed, limit: int) -> TaskSucceeded | TaskFailed:
    """``outcome``, or its ``result_too_large`` failure when it would not fit in a record (Kafka would refuse it)."""
    if isinstance(outcome, TaskFailed):
        return outcome
    return too_large(run, len(encode(outcome)), limit, outcome.source) or outcome
