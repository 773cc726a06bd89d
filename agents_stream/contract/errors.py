"""The exception tree of agents-stream; retryability lives on the class.

    TaskError
    ├── PoisonMessage        bad input (layer 1): dead-lettered, never retried
    ├── TransientError       retriable (layer 2): timeouts, connection errors, 5xx
    │   └── RateLimited      429; carries the provider's Retry-After
    ├── PermanentError       the task's own fault (HTTP 400, refusal): failed + DLQ
    │   └── ResultTooLarge   an answer or record over its size limit: failed result_too_large + DLQ
    ├── SystemicError        not the task's fault (401/403, bad config): hold + alert
    └── CircuitOpen          not retried: fall back or hold
    Fenced                   not a task's error: this worker may no longer act for the task's partition

Callers ask the error (``retriable``, ``retry_after``) instead of keeping lists of them.
"""

from __future__ import annotations


class TaskError(Exception):
    """Base of every error a task can meet on its way through the pipeline."""

    retriable: bool = False
    #: The error layer a dead-letter record names (docs/contract.md, "Dead-letter headers").
    layer: str = "downstream"

    def __init__(self, message: str, *, provider: str | None = None) -> None:
        super().__init__(message)
        self.provider = provider


class PoisonMessage(TaskError):
    """Input that can never be processed: null, not UTF-8, not JSON, bad schema, too large."""

    layer = "schema"

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        #: short machine-readable reason, e.g. ``not_json`` or ``schema_violation``
        self.reason = reason
        self.detail = detail


class TransientError(TaskError):
    """A failure that may go away by itself: retry with backoff."""

    retriable = True

    def __init__(
        self, message: str, *, provider: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, provider=provider)
        #: seconds the provider asked us to wait, if it said so
        self.retry_after = retry_after


class RateLimited(TransientError):
    """HTTP 429: retry, but not before ``retry_after`` seconds."""


class PermanentError(TaskError):
    """The task itself cannot succeed (HTTP 400, content refusal): fail it, dead-letter it."""


class ResultTooLarge(PermanentError):
    """An answer or a record bigger than its limit (a provider body, an answer, a task's record): never retried,
    the task ends failed with ``result_too_large`` (its message starts with it)."""


class SystemicError(TaskError):
    """Not the task's fault (401/403, bad config): hold the agent and raise an alert."""


class CircuitOpen(TaskError):
    """The provider takes no call now (breaker open, no probe place, Retry-After pending):
    not retried, the caller falls back or holds."""

    def __init__(self, message: str, *, provider: str | None = None, retry_at: float | None = None) -> None:
        super().__init__(message, provider=provider)
        #: unix time the provider may take calls again, when known
        self.retry_at = retry_at


def classify(exc: BaseException) -> str:
    """The handling an error asks for: ``transient``, ``permanent``, ``systemic`` or ``circuit_open``.

    Anything outside the tree (a bug, an unexpected library error) is treated
    as transient: retried, then held — never blamed on the task.
    """
    if isinstance(exc, CircuitOpen):
        return "circuit_open"
    if isinstance(exc, PermanentError):
        return "permanent"
    if isinstance(exc, SystemicError):
        return "systemic"
    return "transient"


class Interrupted(Exception):
    """A conversation's round stops at a safe point (its last step journaled, nothing running) because a message
    came that its agent answers by interrupting (``double_texting = "interrupt"``): the round is dispatched again
    with the message in its journal (ledger/conversation_rounds.py)."""


class Fenced(Exception):
    """This worker may no longer act for a task: its partition moved (or may have: the group did not confirm this
    worker as a member lately), so a write it made is not known to be in the state the partition's owner
    recovered. The run stops without acting on it; the owner takes the task over (docs/security.md, "Fencing")."""
