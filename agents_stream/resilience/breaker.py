"""The breaker of one circuit (a provider endpoint): a pure state machine folded from the circuits log.

       failure_threshold failures in a row (more when the window shows
       the provider failing that often by chance), or a failure rate of
       failure_rate_threshold over window_s once it holds minimum_calls
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

import math
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
    "longest_run",
    "run_needed",
    "reopens_at",
    "step",
    "view",
]

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
STATES = (CLOSED, OPEN, HALF_OPEN)

#: the failure-rate window is kept in this many buckets (its edge is exact to window_s / BUCKETS)
BUCKETS = 10
#: a run of failures opens the breaker once a provider failing at the window's rate would produce it by
#: chance less often than once in this many failures (9 in a row at a 10% error rate)
CHANCE = 1e-8


@dataclass(frozen=True)
class Failure:
    """A call to the provider failed; ``probe_id`` is set when the call was an admitted probe."""

    at: float
    probe_id: str | None = None


@dataclass(frozen=True)
class Success:
    """``count`` calls to the provider succeeded, the latest at ``at``; ``probe_id`` is set when the call was an
    admitted probe. Workers report closed-state successes in counts, not one event per call."""

    at: float
    probe_id: str | None = None
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"a success report stands for at least one call, not {self.count}")


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
    #: the run: failure times inside the window after the latest success, oldest first (closed state only)
    failures: tuple[float, ...] = ()
    #: the latest success known (closed state only): failures before it are no run
    last_success_at: float | None = None
    #: the failure-rate window: (bucket, successes, failures), bucket = floor(at / (window_s / BUCKETS))
    window: tuple[tuple[int, int, int], ...] = ()
    #: the newest report seen since it closed: the window ends there (a late report cannot move it back)
    latest_at: float | None = None
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
    if isinstance(event, ProbeRequest):
        return b, None  # closed needs no probe
    # The window ends at the latest report seen, not at this event: a report that
    # arrives late (its worker's clock behind) must not push newer ones out.
    latest = event.at if b.latest_at is None else max(b.latest_at, event.at)
    horizon = latest - cfg.window_s
    if isinstance(event, Success):
        # A success ends the run: the failures before it were no dead provider. At the same time the log's
        # order decides (the broker gives a whole batch one time): a failure folded before it is before it.
        last = event.at if b.last_success_at is None else max(b.last_success_at, event.at)
        run = tuple(t for t in b.failures if t > event.at and t > horizon)
        window = _count_in(b.window, event.at, latest, cfg, successes=event.count)
        return replace(
            b, failures=run, last_success_at=last, window=window, latest_at=latest,
            total_successes=b.total_successes + event.count,
        ), None
    run = tuple(t for t in b.failures if t > horizon)
    if event.at > horizon and (b.last_success_at is None or event.at >= b.last_success_at):
        run = tuple(sorted((*run, event.at)))
    window = _count_in(b.window, event.at, latest, cfg, failures=1)
    b = replace(b, failures=run, window=window, latest_at=latest, total_failures=b.total_failures + 1)
    reason = _opens(b, cfg)
    if reason is None:
        return b, None
    # Opened at the latest report, so a late one can't date the opening (and the
    # end of the open timeout) back before reports already in the log.
    b = replace(b, state=OPEN, opened_at=latest, opens=b.opens + 1, **_FRESH)
    return b, Transition(CLOSED, OPEN, latest, reason)


#: the closed state's counts, emptied when it opens or closes again
_FRESH: dict[str, Any] = {"failures": (), "last_success_at": None, "window": (), "latest_at": None}


def _count_in(
    window: tuple[tuple[int, int, int], ...], at: float, latest: float, cfg: BreakerConfig,
    *, successes: int = 0, failures: int = 0,
) -> tuple[tuple[int, int, int], ...]:
    """The window with one report added to its bucket; buckets older than ``latest - window_s`` dropped."""
    width = cfg.window_s / BUCKETS
    oldest = math.floor((latest - cfg.window_s) / width)  # a bucket partly inside still counts
    bucket = math.floor(at / width)
    kept = {k: (s, f) for k, s, f in window if k >= oldest}
    if bucket >= oldest:
        s, f = kept.get(bucket, (0, 0))
        kept[bucket] = (s + successes, f + failures)
    return tuple((k, s, f) for k, (s, f) in sorted(kept.items()))


def _opens(b: Breaker, cfg: BreakerConfig) -> str | None:
    """Why the closed breaker opens now, or None."""
    successes = sum(s for _, s, _ in b.window)
    failures = sum(f for _, _, f in b.window)
    calls = successes + failures
    if calls >= cfg.minimum_calls and failures >= cfg.failure_rate_threshold * calls:
        return f"failure rate {failures / calls:.0%} of {calls} calls in {cfg.window_s:g}s"
    run = len(b.failures)
    if run >= run_needed(successes, max(0, failures - run), cfg):
        return f"{_count(run, 'failure')} in a row"
    return None


def run_needed(successes: int, failures: int, cfg: BreakerConfig) -> int:
    """How many failures in a row open the breaker, given the window's calls before the run.

    ``failure_threshold``, lengthened for a provider the window shows failing a share ``r`` of its calls to the run
    it would produce by chance less than once in 1/CHANCE failures (``1 + log CHANCE / log r``): a provider that
    fails 10% of its calls needs 9 in a row, so its ordinary errors never open it, while a healthy one that dies
    opens at ``failure_threshold``. With fewer than ``minimum_calls`` calls the rate is not known: the threshold.
    """
    calls = successes + failures
    if calls < cfg.minimum_calls or failures == 0 or successes == 0:
        return cfg.failure_threshold
    by_chance = 1 + _ceil(math.log(CHANCE) / math.log(failures / calls))
    # Never past the call bound's run: a rate at or over the rate threshold opens by the rate, and with
    # failure_rate_threshold = 1 a window that is not all failures would otherwise need a run of any length.
    return min(max(cfg.failure_threshold, by_chance), longest_run(cfg))


def longest_run(cfg: BreakerConfig) -> int:
    """The longest run of failures that can leave the breaker closed, plus one: the call bound's failure term.

    A window failing at ``failure_rate_threshold`` or more opens by the rate, so the run needed is largest just
    below it.
    """
    rate = min(cfg.failure_rate_threshold, 1.0)
    if rate >= 1.0:
        return cfg.failure_threshold
    return max(cfg.failure_threshold, 1 + _ceil(math.log(CHANCE) / math.log(rate)))


def _ceil(x: float) -> int:
    # log(1e-8) / log(0.1) is 8 give or take a rounding error; it must not become 9
    return math.ceil(x - 1e-9)


def _open(b: Breaker, event: _Call) -> Breaker:
    # Reports of calls that were already in flight when it opened: counted, nothing else.
    if isinstance(event, Failure):
        return replace(b, total_failures=b.total_failures + 1)
    if isinstance(event, Success):
        return replace(b, total_successes=b.total_successes + event.count)
    return b  # probes wait for the open timeout


def _half_open(b: Breaker, event: _Call, cfg: BreakerConfig) -> tuple[Breaker, Transition | None]:
    if isinstance(event, ProbeRequest):
        # A probe whose worker died never reports; after probe_timeout_s its place is freed.
        probes = tuple((pid, t) for pid, t in b.probes if event.at - t <= cfg.probe_timeout_s)
        if len(probes) < cfg.half_open_probes and event.probe_id not in {pid for pid, _ in probes}:
            probes = (*probes, (event.probe_id, event.at))
        return replace(b, probes=probes), None
    if isinstance(event, Success):
        b = replace(b, total_successes=b.total_successes + event.count)
        if event.probe_id is None or not admitted(b, event.probe_id):
            return b, None  # a call from before it opened, or a probe that timed out
        successes = b.successes + 1
        probes = tuple(p for p in b.probes if p[0] != event.probe_id)
        if successes < cfg.success_threshold:
            return replace(b, successes=successes, probes=probes), None
        closed = replace(b, state=CLOSED, successes=0, probes=(), closed_at=event.at, **_FRESH)
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
        successes=0,
        probes=(),
        **_FRESH,
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
        **_window_view(b, now, cfg),
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


def _window_view(b: Breaker, now: float, cfg: BreakerConfig) -> dict[str, Any]:
    """The failure-rate window at ``now``, as operators read it."""
    oldest = math.floor((now - cfg.window_s) / (cfg.window_s / BUCKETS))
    successes = sum(s for k, s, _ in b.window if k >= oldest)
    failures = sum(f for k, _, f in b.window if k >= oldest)
    calls = successes + failures
    return {
        "calls_in_window": calls,
        "failure_rate": round(failures / calls, 4) if calls else None,
        "failures_in_a_row_to_open": run_needed(successes, max(0, failures - len(b.failures)), cfg),
    }
