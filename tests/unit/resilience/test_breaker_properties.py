"""The circuit breaker's properties for any log, and a stateful reference model."""

from __future__ import annotations

import heapq
import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from agents_stream.config import BreakerConfig
from agents_stream.resilience.breaker import (
    BUCKETS,
    CLOSED,
    HALF_OPEN,
    OPEN,
    STATES,
    Adopt,
    Breaker,
    Event,
    Failure,
    ProbeRequest,
    Success,
    Transition,
    admitted,
    longest_run,
    run_needed,
    step,
    view,
)
from tests.unit.breaker_helpers import fold

# --- properties ------------------------------------------------------------------------

configs = st.builds(
    BreakerConfig,
    failure_threshold=st.integers(1, 5),
    failure_rate_threshold=st.sampled_from([0.2, 0.5, 1.0]),
    minimum_calls=st.integers(1, 30),
    success_threshold=st.integers(1, 3),
    open_timeout_s=st.floats(0.5, 20.0),
    window_s=st.floats(1.0, 50.0),
    half_open_probes=st.integers(1, 3),
    probe_timeout_s=st.floats(0.5, 30.0),
)
probe_ids = st.sampled_from(["p0", "p1", "p2", "p3", "p4"])
report_ids = st.one_of(st.none(), probe_ids)


def events_at(at: float) -> st.SearchStrategy[Event]:
    """Any breaker event at time ``at``; probe requests are the most common, as in a busy half-open."""
    return st.one_of(
        st.builds(Failure, st.just(at), report_ids),
        st.builds(Success, st.just(at), report_ids),
        st.builds(Success, st.just(at), st.none(), st.integers(1, 30)),
        st.builds(ProbeRequest, st.just(at), probe_ids),
        st.builds(ProbeRequest, st.just(at), probe_ids),
        st.builds(
            Adopt,
            st.just(at),
            st.sampled_from([CLOSED, HALF_OPEN]),
            st.none(),
            st.none(),
        ),
        st.builds(Adopt, st.just(at), st.just(OPEN), st.just(at), st.none()),
    )


gaps = st.one_of(st.just(0.0), st.floats(0.0, 5.0), st.floats(5.0, 40.0))


@st.composite
def ordered_logs(draw: st.DrawFn) -> list[Event]:
    """An event log with non-decreasing timestamps."""
    t = draw(st.floats(0.0, 1000.0))
    log = []
    for gap in draw(st.lists(gaps, max_size=80)):
        t += gap
        log.append(draw(events_at(t)))
    return log


@st.composite
def shuffled_logs(draw: st.DrawFn) -> list[Event]:
    """An event log whose timestamps are in any order (skewed clocks, late reports)."""
    times = draw(st.lists(st.floats(0.0, 300.0), max_size=80))
    return [draw(events_at(t)) for t in times]


def assert_invariants(
    before: Breaker, event: Event, after: Breaker, moved: list[Transition], cfg: BreakerConfig
) -> None:
    """What must hold after every single step, whatever the log."""
    assert after.state in STATES
    assert len(after.probes) <= cfg.half_open_probes
    assert len({pid for pid, _ in after.probes}) == len(after.probes)
    if after.state != HALF_OPEN:
        assert after.probes == () and after.successes == 0
    if after.state != CLOSED:
        assert after.failures == ()
    assert len(after.failures) < longest_run(cfg)
    assert after.successes < cfg.success_threshold
    # Counters are monotonic and count every report exactly once.
    assert after.total_failures - before.total_failures == isinstance(event, Failure)
    assert after.total_successes - before.total_successes == (event.count if isinstance(event, Success) else 0)
    assert after.opens - before.opens == sum(1 for m in moved if m.to == OPEN and not isinstance(event, Adopt))
    # Transitions chain from the old state to the new one.
    state = before.state
    for m in moved:
        assert m.frm == state and m.to != m.frm
        state = m.to
    assert state == after.state
    assert len(moved) <= 2


@settings(max_examples=300)
@given(cfg=configs, log=ordered_logs())
def test_invariants_hold_for_any_ordered_log(cfg: BreakerConfig, log: list[Event]) -> None:
    """In-flight probes never exceed half_open_probes, counters count every report, transitions chain, for any log."""
    b = Breaker()
    for event in log:
        after, moved = step(b, event, cfg)
        assert_invariants(b, event, after, moved, cfg)
        b = after


@settings(max_examples=300)
@given(cfg=configs, log=shuffled_logs())
def test_invariants_hold_for_a_log_in_any_time_order(cfg: BreakerConfig, log: list[Event]) -> None:
    """Late and out-of-order reports never break the bounds: probes, failure counts and counters stay right."""
    b = Breaker()
    for event in log:
        after, moved = step(b, event, cfg)
        assert_invariants(b, event, after, moved, cfg)
        b = after


@settings(max_examples=200)
@given(cfg=configs, log=st.one_of(ordered_logs(), shuffled_logs()), cut=st.integers(0, 80))
def test_the_fold_is_deterministic(cfg: BreakerConfig, log: list[Event], cut: int) -> None:
    """Every worker folding the same log reaches the same breaker, also when it resumes from a snapshot."""
    first = fold(log, cfg)
    again = fold(list(log), BreakerConfig(**cfg.model_dump()))
    assert first == again
    snapshot, early = fold(log[:cut], cfg)
    resumed, late = fold(log[cut:], cfg, snapshot)
    assert (resumed, early + late) == first


@settings(max_examples=300)
@given(
    # the run rule alone: a window of at most 40 calls never reaches minimum_calls, so the rate cannot open it
    cfg=configs.map(lambda c: c.model_copy(update={"minimum_calls": 100})),
    start=st.floats(0.0, 1000.0),
    gaps=st.lists(st.one_of(st.just(0.0), st.floats(0.0, 30.0)), min_size=1, max_size=40),
)
def test_a_failing_provider_opens_at_exactly_the_threshold_th_failure(
    cfg: BreakerConfig, start: float, gaps: list[float]
) -> None:
    """A provider whose every call fails has at most failure_threshold failures counted before the breaker opens
    (below minimum_calls, as with no history)."""
    times = list(itertools.accumulate(gaps, initial=start))[1:]

    def in_window(i: int) -> int:
        return sum(1 for s in times[: i + 1] if s > times[i] - cfg.window_s)

    # The reference: the first failure with threshold-1 others inside the window before it.
    expected_open = next((i for i in range(len(times)) if in_window(i) >= cfg.failure_threshold), None)
    b = Breaker()
    for i, t in enumerate(times):
        b, moved = step(b, Failure(t), cfg)
        assert len(b.failures) < cfg.failure_threshold
        if expected_open is None or i < expected_open:
            assert b.state == CLOSED and moved == []
        elif i == expected_open:
            assert b.state == OPEN
            assert [(m.frm, m.to, m.at) for m in moved] == [(CLOSED, OPEN, t)]
    # Failures that are no probe's can never close or reopen it: it opened at most once.
    assert b.opens == (0 if expected_open is None else 1)
    assert b.total_failures == len(times)


@settings(max_examples=300)
@given(
    cfg=configs,
    workers=st.integers(1, 6),
    arrivals=st.lists(
        st.tuples(st.floats(0.0, 10.0), st.integers(0, 5), st.floats(0.0, 0.99)), min_size=1, max_size=150
    ),
)
def test_a_dead_provider_gets_at_most_half_open_probes_calls_per_half_open_window(
    cfg: BreakerConfig, workers: int, arrivals: list[tuple[float, int, float]]
) -> None:
    """Workers that probe only when admitted send a dead provider at most half_open_probes
    calls per half-open window."""
    b = Breaker()
    t = 0.0
    in_flight: list[tuple[float, int, str | None]] = []  # heap of (done_at, worker, probe id or None)
    probes_this_window = 0
    for n, (gap, worker, duration) in enumerate(arrivals):
        t += gap
        worker %= workers
        # Calls due by now come back first, in time order; the provider is down, so they fail.
        while in_flight and in_flight[0][0] <= t:
            done_at, _, pid = heapq.heappop(in_flight)
            b, moved = step(b, Failure(done_at, pid), cfg)
            if any(m.to == HALF_OPEN for m in moved):
                probes_this_window = 0
        if worker in {w for _, w, _ in in_flight} or view(b, t, cfg) == OPEN:
            continue
        # Live workers: every call returns before its probe would time out.
        done_at = t + duration * cfg.probe_timeout_s
        if view(b, t, cfg) == CLOSED:
            heapq.heappush(in_flight, (done_at, worker, None))
            continue
        b, moved = step(b, ProbeRequest(t, f"probe-{n}"), cfg)
        if any(m.to == HALF_OPEN for m in moved):
            probes_this_window = 0
        if admitted(b, f"probe-{n}"):
            heapq.heappush(in_flight, (done_at, worker, f"probe-{n}"))
            probes_this_window += 1
            assert probes_this_window <= cfg.half_open_probes
    # A dead provider never answers a probe with success, so it never closes.
    assert b.closed_at is None


# --- stateful model ------------------------------------------------------------------


class Reference:
    """The spec written the naive way: mutable, keeping every failure since the last close."""

    def __init__(self, cfg: BreakerConfig) -> None:
        self.cfg = cfg
        self.state = CLOSED
        self.opened_at: float | None = None
        self.closed_at: float | None = None
        self.reports: list[tuple[float, bool, int]] = []  # (at, success?, calls) since it last closed
        self.successes = 0
        self.probes: dict[str, float] = {}
        self.total_failures = 0
        self.total_successes = 0
        self.opens = 0

    def tick(self, at: float) -> None:
        if self.state == OPEN and at >= self.opened_at + self.cfg.open_timeout_s:
            self.state, self.successes, self.probes = HALF_OPEN, 0, {}

    def open(self, at: float) -> None:
        self.state, self.opened_at, self.opens = OPEN, at, self.opens + 1
        self.reports, self.successes, self.probes = [], 0, {}

    def latest(self) -> float:
        return max(t for t, _, _ in self.reports)

    def in_window(self) -> int:
        """The run: failures inside the window newer than every success reported since it closed; at the same
        time, the one reported later is the newer (the broker gives a whole batch one time)."""
        if not self.reports:
            return 0
        horizon = self.latest() - self.cfg.window_s
        last_ok = max(((t, i) for i, (t, ok, _) in enumerate(self.reports) if ok), default=None)
        return sum(
            1 for i, (t, ok, _) in enumerate(self.reports)
            if not ok and t > horizon and (last_ok is None or (t, i) > last_ok)
        )

    def counts(self) -> tuple[int, int]:
        """Successes and failures in the rate window: every report whose bucket is not older than the window."""
        width = self.cfg.window_s / BUCKETS
        oldest = math.floor((self.latest() - self.cfg.window_s) / width)
        inside = [(ok, n) for t, ok, n in self.reports if math.floor(t / width) >= oldest]
        return sum(n for ok, n in inside if ok), sum(n for ok, n in inside if not ok)

    def failure(self, at: float, pid: str | None) -> None:
        self.tick(at)
        self.total_failures += 1
        if self.state == CLOSED:
            self.reports.append((at, False, 1))
            s, f = self.counts()
            run = self.in_window()
            by_rate = s + f >= self.cfg.minimum_calls and f >= self.cfg.failure_rate_threshold * (s + f)
            if by_rate or run >= run_needed(s, max(0, f - run), self.cfg):
                self.open(self.latest())
        elif self.state == HALF_OPEN and pid in self.probes:
            self.open(at)

    def success(self, at: float, pid: str | None, count: int = 1) -> None:
        self.tick(at)
        self.total_successes += count
        if self.state == CLOSED:
            self.reports.append((at, True, count))
        if self.state == HALF_OPEN and pid in self.probes:
            del self.probes[pid]
            self.successes += 1
            if self.successes >= self.cfg.success_threshold:
                self.state, self.closed_at, self.successes, self.probes = CLOSED, at, 0, {}
                self.reports = []

    def probe(self, at: float, pid: str) -> None:
        self.tick(at)
        if self.state != HALF_OPEN:
            return
        for other, admitted_at in list(self.probes.items()):
            if at - admitted_at > self.cfg.probe_timeout_s:
                del self.probes[other]
        if pid not in self.probes and len(self.probes) < self.cfg.half_open_probes:
            self.probes[pid] = at

    def adopt(self, state: str, opened_at: float | None, closed_at: float | None) -> None:
        self.state, self.opened_at, self.closed_at = state, opened_at, closed_at
        self.reports, self.successes, self.probes = [], 0, {}


class BreakerMachine(RuleBasedStateMachine):
    """Drives step() and the reference with the same events and compares them after each."""

    @initialize(cfg=configs)
    def setup(self, cfg: BreakerConfig) -> None:
        self.cfg = cfg
        self.b = Breaker()
        self.ref = Reference(cfg)
        self.now = 0.0

    def apply(self, event: Event) -> None:
        before = self.b
        self.b, moved = step(self.b, event, self.cfg)
        assert_invariants(before, event, self.b, moved, self.cfg)

    def at(self, gap: float, late: float) -> float:
        """Advance the clock by ``gap``; the event itself may be stamped ``late`` seconds behind it."""
        self.now += gap
        return self.now - late

    times = {"gap": st.floats(0.0, 15.0), "late": st.one_of(st.just(0.0), st.just(0.0), st.floats(0.0, 30.0))}

    @rule(**times, pid=report_ids)
    def failure(self, gap: float, late: float, pid: str | None) -> None:
        at = self.at(gap, late)
        self.apply(Failure(at, pid))
        self.ref.failure(at, pid)

    @rule(**times, pid=report_ids, count=st.sampled_from([1, 1, 5]))
    def success(self, gap: float, late: float, pid: str | None, count: int) -> None:
        at = self.at(gap, late)
        self.apply(Success(at, pid, count))
        self.ref.success(at, pid, count)

    @rule(**times, pid=probe_ids)
    def probe(self, gap: float, late: float, pid: str) -> None:
        at = self.at(gap, late)
        self.apply(ProbeRequest(at, pid))
        self.ref.probe(at, pid)

    @precondition(lambda self: self.b.probes)
    @rule(gap=st.floats(0.0, 5.0), ok=st.booleans(), pick=st.integers(0, 10))
    def probe_reports(self, gap: float, ok: bool, pick: int) -> None:
        # Reports of probes that are actually admitted, so the model reaches closed and reopens often.
        pid = self.b.probes[pick % len(self.b.probes)][0]
        at = self.at(gap, 0.0)
        self.apply((Success if ok else Failure)(at, pid))
        (self.ref.success if ok else self.ref.failure)(at, pid)

    @rule(gap=st.floats(0.0, 15.0), state=st.sampled_from(STATES), back=st.floats(0.0, 40.0), closed=st.booleans())
    def adopt(self, gap: float, state: str, back: float, closed: bool) -> None:
        at = self.at(gap, 0.0)
        opened_at = at - back if state == OPEN else None
        closed_at = at - back if closed else None
        self.apply(Adopt(at, state, opened_at, closed_at))
        self.ref.adopt(state, opened_at, closed_at)

    @invariant()
    def matches_the_reference(self) -> None:
        if not hasattr(self, "ref"):
            return
        b, ref = self.b, self.ref
        assert b.state == ref.state
        assert b.opened_at == ref.opened_at
        assert b.closed_at == ref.closed_at
        assert b.successes == ref.successes
        assert dict(b.probes) == ref.probes
        assert len(b.failures) == ref.in_window()
        assert (b.total_failures, b.total_successes, b.opens) == (ref.total_failures, ref.total_successes, ref.opens)
        assert view(b, self.now, self.cfg) in STATES


def test_breaker_matches_a_reference_model() -> None:
    """step() behaves exactly like a naive reading of the spec, for any interleaving of events."""
    run_state_machine_as_test(BreakerMachine, settings=settings(max_examples=200, stateful_step_count=60))
