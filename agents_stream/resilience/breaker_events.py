"""From a record of the circuits log to what a breaker folds: the record decoded (None for a newer worker's kind),
the breaker events it stands for, dated on the log's clock, and whether it resets its sender's success count.

The records' format is ``contract/circuit_records.py``'s; nothing here adds to it.
"""

from __future__ import annotations

from agents_stream.contract.events import (
    CIRCUITS,
    CircuitFailure,
    CircuitProbe,
    CircuitProbeCancel,
    CircuitsEvent,
    CircuitSuccess,
    CircuitTransition,
    EventDecodeError,
    decode,
)
from agents_stream.resilience import breaker

__all__ = ["breaker_events", "read", "resets_count"]


def read(value: bytes | None) -> CircuitsEvent | None:
    """The event of one record; None for a kind this version does not know (a newer worker's: skipped silently).
    EventDecodeError for a record that is not an event of the log (the fold logs and skips it)."""
    try:
        return decode(value, CIRCUITS)
    except EventDecodeError as exc:
        if exc.unknown_kind:
            return None
        raise


def breaker_events(ev: CircuitsEvent, at: float, floor: float | None = None) -> list[breaker.Event]:
    """The breaker's events, in order, for a log event at ``at``: none for the kinds the breaker does not fold
    (presence, Retry-After); a failure that carries its worker's successes is those successes, then the failure.

    Ages travel as durations measured on the sender's clock and are anchored to ``at`` (the broker's time), so a
    skewed clock cannot date a success after failures the log already holds. ``floor`` is the time of the
    sender's previous report (a failure or a count) of this circuit: the successes a report counts came after it.
    The broker gives every record of a producer batch one time, so without the floor a success between two
    failures of one batch would be dated before both, and they would read as a run.
    """
    match ev:
        case CircuitTransition():
            # Never later than the record itself: a time ahead would keep a forged open breaker shut for as long.
            opened_at = None if ev.opened_at is None else min(ev.opened_at, at)
            closed_at = None if ev.closed_at is None else min(ev.closed_at, at)
            return [breaker.Adopt(at=at, state=ev.to, opened_at=opened_at, closed_at=closed_at)]
        case CircuitFailure():
            failure = breaker.Failure(at=at, probe_id=ev.probe_id)
            if ev.successes is None:
                return [failure]
            return [breaker.Success(at=_dated(at, ev.success_age, floor), count=ev.successes), failure]
        case CircuitSuccess() if ev.count is not None:
            return [breaker.Success(at=_dated(at, ev.age, floor), probe_id=ev.probe_id, count=ev.count)]
        case CircuitSuccess():
            return [breaker.Success(at=at - (ev.age or 0.0), probe_id=ev.probe_id)]
        case CircuitProbe():
            return [breaker.ProbeRequest(at=at, probe_id=ev.probe_id)]
        case CircuitProbeCancel():
            return [breaker.ProbeCancel(at=at, probe_id=ev.probe_id)]
    return []


def resets_count(ev: CircuitsEvent) -> bool:
    """Whether ``ev`` is one of its sender's reports of a circuit's successes (a failure or a count): the
    successes its next report counts come after it."""
    return isinstance(ev, CircuitFailure) or (isinstance(ev, CircuitSuccess) and ev.count is not None)


def _dated(at: float, age: float | None, floor: float | None) -> float:
    """When the latest success a report counts happened: ``age`` before the record, never before ``floor``."""
    dated = at - (age or 0.0)
    return dated if floor is None else min(at, max(dated, floor))
