"""How big a task's record is, and the result_too_large failure of an outcome that would make it too big (pure)."""

from __future__ import annotations

import json

from agents_stream.contract.events import JournalEntry, StepDone, TaskFailed, TaskSucceeded
from agents_stream.contract.models import Usage
from agents_stream.kafka.delivery import RECORD_OVERHEAD_BYTES
from agents_stream.tables.leases import TaskRecord

__all__ = ["REASON", "oversize", "record_bytes", "subresult_too_large"]

#: the start of the dead letter's error_reason and of the failed result's error
REASON = "result_too_large"


def record_bytes(record: TaskRecord) -> int:
    """The size of ``record`` as its changelog record carries it (JSON, as the table's serializer writes it)."""
    return len(json.dumps(record.to_json()).encode("utf-8"))


#: what a record's JSON adds beyond its strings: field names, quotes, numbers, punctuation (about 400 bytes today)
_FIELDS_BYTES = 2048


def _at_most_bytes(record: TaskRecord) -> int:
    """An upper bound of ``record_bytes``: JSON (ensure_ascii) writes a character in at most twelve bytes (a
    surrogate pair, ``\\ud83d\\ude00``)."""
    strings = 0
    for value in record.to_json().values():
        if isinstance(value, str):
            strings += len(value)
    return 12 * strings + _FIELDS_BYTES


def subresult_too_large(new: TaskRecord, limit: int) -> str | None:
    """Why ``new`` (a caller's record with a sub-task's result journaled) cannot be one Kafka record of ``limit``
    bytes, or None when it fits: ``arrive`` then journals the call as failed with this reason instead."""
    if _at_most_bytes(new) + RECORD_OVERHEAD_BYTES <= limit:
        return None
    size = record_bytes(new) + RECORD_OVERHEAD_BYTES
    if size <= limit:
        return None
    return (f"{REASON}: with the sub-task's result the caller's record is {size} bytes > "
            f"AGENTS_STREAM_RECORD_MAX_BYTES {limit}; the result is not kept")


def oversize(
    new: TaskRecord | None, event: TaskSucceeded | TaskFailed | StepDone | JournalEntry, limit: int,
) -> TaskFailed | None:
    """The result_too_large failure to apply instead of ``event`` when the record it makes (``new``) would not fit
    in one Kafka record of ``limit`` bytes; None when it fits (or ``event`` is that failure already)."""
    if new is None or (isinstance(event, TaskFailed) and event.reason.startswith(REASON)):
        return None
    if _at_most_bytes(new) + RECORD_OVERHEAD_BYTES <= limit:
        return None  # the common case, without serialising the record a second time
    size = record_bytes(new) + RECORD_OVERHEAD_BYTES
    if size <= limit:
        return None
    error = f"{REASON}: with {_what(event)} the task's record is {size} bytes > AGENTS_STREAM_RECORD_MAX_BYTES {limit}"
    if isinstance(event, StepDone | JournalEntry):
        return TaskFailed(
            worker=event.worker, dispatch=event.dispatch, calls=0, usage=Usage(), route=None, error=error,
            reason=error, source="checkpoint",
        )
    return TaskFailed(
        worker=event.worker, dispatch=event.dispatch, calls=event.calls, usage=event.usage, route=event.route,
        error=error, reason=error, source=event.source,
    )


def _what(event: TaskSucceeded | TaskFailed | StepDone | JournalEntry) -> str:
    if isinstance(event, StepDone):
        return f"the checkpoint of step {event.index + 1}"
    if isinstance(event, JournalEntry):
        return f"journal entry {event.index + 1}"
    return "the result"
