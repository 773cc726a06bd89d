"""Circuit breaker of one provider: a pure state machine folded from the breaker event log.

           failure_threshold failures within window_s
+--------+ -----------------------------------------> +------+
| CLOSED |                                            | OPEN | <------+
+--------+ <---------------+                          +------+        |
                           |                              |           |
         success_threshold |               open_timeout_s |           | a probe
           probe successes |                      elapsed |           | fails
                           |                              v           |
                           |                        +-----------+     |
                           +----------------------- | HALF_OPEN | ----+
                                                    +-----------+
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from agents_stream.config import BreakerConfig

__all__ = [
    "CLOSED",
    "HALF_OPEN",
    "OPEN",
    "STATES",
    "Adopt",
    "Breaker",
    "Event",
    "Failure",
    "ProbeCancel",
    "ProbeRequest",
    "Success",
    "Transition",
    "admitted",
    "as_dict",
    "reopens_at",
    "step",
    "view",
]

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
STATES = (CLOSED, OPEN, HALF_OPEN)


@dataclass(frozen=True)
class Failure:
    """A call to the provider failed; ``probe_id`` is set when the call was an admitted probe."""

    at: float
    probe_id: str | None = None


@dataclass(frozen=True)
class Success:
    """A call to the provider succeeded; ``probe_id`` is set when the call was an admitted probe."""

    at: float
    probe_id: str | None = None


@dataclass(frozen=True)
class ProbeRequest:
    """A worker asks to send probe ``probe_id``; it may send it once ``admitted()`` says so."""

    at: float
    probe_id: str


@dataclass(frozen=True)
class ProbeCancel:
    """A worker gives back an admitted probe it will not send (its verdict came too late, or it stopped)."""

    at: float
    probe_id: str


@dataclass(frozen=True)
class Adopt:
    """Sync a joining worker to a transition another worker recorded."""

    at: float
    state: str
    opened_at: float | None
    closed_at: float | None

    def __post_init__(self) -> None:
        _check(self.state, self.opened_at)


Event = Failure | Success | ProbeRequest | ProbeCancel | Adopt
#: the events that reach the per-state steps (a cancel only frees a place, an adoption replaces the state)
_Call = Failure | Success | ProbeRequest


@dataclass(frozen=True)
class Transition:
    """The breaker moved from ``frm`` to ``to`` at ``at``; ``reason`` is for people."""

    frm: str
    to: str
    at: float
    reason: str


@dataclass(frozen=True)
class Breaker:
    """The breaker of one provider, as folded from its event log."""

    state: str = CLOSED
    #: failure times inside the window, oldest first (closed state only)
    failures: tuple[float, ...] = ()
    opened_at: float | None = None
    #: when it last closed (for the slow-start ramp); None = never opened
    closed_at: float | None = None
    #: probe successes in this half-open window
    successes: int = 0
    #: admitted probes not yet reported: (probe_id, admitted_at)
    probes: tuple[tuple[str, float], ...] = ()
    # Monotonic counters for operators.
    total_failures: int = 0
    total_successes: int = 0
    opens: int = 0

    def __post_init__(self) -> None:
        _check(self.state, self.opened_at)


def _check(state: str, opened_at: float | None) -> None:
    if state not in STATES:
        raise ValueError(f"unknown breaker state {state!r}; expected one of {STATES}")
    # Without opened_at an open breaker could never time out into half-open.
    if state == OPEN and opened_at is None:
        raise ValueError("an open breaker needs opened_at")


def step(b: Breaker, event: Event, cfg: BreakerConfig) -> tuple[Breaker, list[Transition]]:
    """Apply one event; return the new breaker and the transitions it made, in order.

    Every worker folds the same ordered log, so this reads only ``event.at``, never
    a local clock: the same events give the same breaker on every worker.
    """
    if isinstance(event, Adopt):
        return _adopt(b, event)
    if not isinstance(event, Failure | Success | ProbeRequest | ProbeCancel):
        raise TypeError(f"not a breaker event: {event!r}")
    transitions: list[Transition] = []
    due = reopens_at(b, cfg)
    if due is not None and event.at >= due:
        # The timeout is not an event in the log; the first event past it carries it.
        b = replace(b, state=HALF_OPEN, successes=0, probes=())
        transitions.append(Transition(OPEN, HALF_OPEN, due, f"open_timeout {cfg.open_timeout_s:g}s elapsed"))
    if isinstance(event, ProbeCancel):
        # Only the place is freed: a cancelled probe says nothing about the provider.
        return replace(b, probes=tuple(p for p in b.probes if p[0] != event.probe_id)), transitions
    if b.state == CLOSED:
        b, moved = _closed(b, event, cfg)
    elif b.state == OPEN:
        b, moved = _open(b, event), None
    else:
        b, moved = _half_open(b, event, cfg)
    if moved is not None:
        transitions.append(moved)
    return b, transitions


def _closed(b: Breaker, event: _Call, cfg: BreakerConfig) -> tuple[Breaker, Transition | None]:
    if isinstance(event, Success):
        # A sliding window, not a consecutive count: successes don't forgive failures.
        return replace(b, total_successes=b.total_successes + 1), None
    if isinstance(event, ProbeRequest):
        return b, None  # closed needs no probe
    # The window ends at the latest failure seen, not at this event: a report that
    # arrives late (its worker's clock behind) must not push newer failures out.
    latest = max((event.at, *b.failures))
    horizon = latest - cfg.window_s
    failures = tuple(sorted(t for t in (*b.failures, event.at) if t > horizon))
    b = replace(b, failures=failures, total_failures=b.total_failures + 1)
    if len(failures) < cfg.failure_threshold:
        return b, None
    # Opened at the latest failure, so a late report can't date the opening (and the
    # end of the open timeout) back before failures already in the log.
    reason = f"{_count(len(failures), 'failure')} in {cfg.window_s:g}s"
    b = replace(b, state=OPEN, opened_at=latest, failures=(), opens=b.opens + 1)
    return b, Transition(CLOSED, OPEN, latest, reason)


def _open(b: Breaker, event: _Call) -> Breaker:
    # Reports of calls that were already in flight when it opened: counted, nothing else.
    if isinstance(event, Failure):
        return replace(b, total_failures=b.total_failures + 1)
    if isinstance(event, Success):
        return replace(b, total_successes=b.total_successes + 1)
    return b  # probes wait for the open timeout


def _half_open(b: Breaker, event: _Call, cfg: BreakerConfig) -> tuple[Breaker, Transition | None]:
    if isinstance(event, ProbeRequest):
        # A probe whose worker died never reports; after probe_timeout_s its place is freed.
        probes = tuple((pid, t) for pid, t in b.probes if event.at - t <= cfg.probe_timeout_s)
        if len(probes) < cfg.half_open_probes and event.probe_id not in {pid for pid, _ in probes}:
            probes = (*probes, (event.probe_id, event.at))
        return replace(b, probes=probes), None
    if isinstance(event, Success):
        b = replace(b, total_successes=b.total_successes + 1)
        if event.probe_id is None or not admitted(b, event.probe_id):
            return b, None  # a call from before it opened, or a probe that timed out
        successes = b.successes + 1
        probes = tuple(p for p in b.probes if p[0] != event.probe_id)
        if successes < cfg.success_threshold:
            return replace(b, successes=successes, probes=probes), None
        closed = replace(b, state=CLOSED, failures=(), successes=0, probes=(), closed_at=event.at)
        return closed, Transition(HALF_OPEN, CLOSED, event.at, _count(successes, "probe success"))
    b = replace(b, total_failures=b.total_failures + 1)
    if event.probe_id is None or not admitted(b, event.probe_id):
        return b, None
    reopened = replace(b, state=OPEN, opened_at=event.at, successes=0, probes=(), opens=b.opens + 1)
    return reopened, Transition(HALF_OPEN, OPEN, event.at, "probe failed")


def _adopt(b: Breaker, event: Adopt) -> tuple[Breaker, list[Transition]]:
    # The other worker's counts of failures, successes and probes are not ours to
    # know; starting them empty is the cautious choice (a fresh window, no probes).
    new = replace(
        b,
        state=event.state,
        opened_at=event.opened_at,
        closed_at=event.closed_at,
        failures=(),
        successes=0,
        probes=(),
    )
    if event.state == b.state:
        return new, []
    return new, [Transition(b.state, event.state, event.at, "adopted")]


def _count(n: int, noun: str) -> str:
    plural = noun + ("es" if noun.endswith("s") else "s")
    return f"{n} {noun if n == 1 else plural}"


def view(b: Breaker, now: float, cfg: BreakerConfig) -> str:
    """The effective state at ``now``: an open breaker whose open timeout elapsed reads half-open."""
    if b.state == OPEN and b.opened_at is not None and now >= b.opened_at + cfg.open_timeout_s:
        return HALF_OPEN
    return b.state


def admitted(b: Breaker, probe_id: str) -> bool:
    """Whether probe ``probe_id`` is admitted and not yet reported, so its worker may send it."""
    return b.state == HALF_OPEN and any(pid == probe_id for pid, _ in b.probes)


def reopens_at(b: Breaker, cfg: BreakerConfig) -> float | None:
    """When an open breaker starts letting probes through; None when it is not open."""
    if b.state != OPEN or b.opened_at is None:
        return None
    return b.opened_at + cfg.open_timeout_s


def as_dict(b: Breaker, now: float, cfg: BreakerConfig) -> dict[str, Any]:
    """A JSON-able view of the breaker at ``now``, for ``/circuits``."""
    state = view(b, now, cfg)
    return {
        "state": state,
        "failures_in_window": sum(1 for t in b.failures if t > now - cfg.window_s),
        "opened_at": b.opened_at,
        "closed_at": b.closed_at,
        "successes": b.successes,
        "probes_in_flight": len(b.probes),
        "total_failures": b.total_failures,
        "total_successes": b.total_successes,
        "opens": b.opens,
        # Only while it reads open: past the timeout it already lets probes through.
        "reopens_at": reopens_at(b, cfg) if state == OPEN else None,
    }
