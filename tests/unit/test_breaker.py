"""The circuit breaker: a pure state machine folded from one ordered event log."""

from __future__ import annotations

import heapq
import itertools
import json
from collections.abc import Iterable
from dataclasses import FrozenInstanceError

import pytest
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
from agents_stream.resilience import breaker
from agents_stream.resilience.breaker import (
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
    as_dict,
    reopens_at,
    step,
    view,
)

CFG = BreakerConfig(
    failure_threshold=3,
    success_threshold=2,
    open_timeout_s=30.0,
    window_s=60.0,
    half_open_probes=1,
    probe_timeout_s=60.0,
)


def fold(
    events: Iterable[Event], cfg: BreakerConfig = CFG, b: Breaker | None = None
) -> tuple[Breaker, list[Transition]]:
    """Fold events into a breaker the way every worker does, collecting the transitions."""
    b = b if b is not None else Breaker()
    transitions: list[Transition] = []
    for event in events:
        b, moved = step(b, event, cfg)
        transitions += moved
    return b, transitions


def opened(at: float = 100.0, cfg: BreakerConfig = CFG) -> Breaker:
    """A breaker that opened at ``at`` after ``failure_threshold`` failures at that instant."""
    b, _ = fold([Failure(at)] * cfg.failure_threshold, cfg)
    assert b.state == OPEN and b.opened_at == at
    return b


def half_open(at: float = 100.0, probe: str = "p1", cfg: BreakerConfig = CFG) -> Breaker:
    """A breaker that opened at ``at`` and went half-open at the timeout, admitting ``probe``."""
    b, _ = step(opened(at, cfg), ProbeRequest(at + cfg.open_timeout_s, probe), cfg)
    assert b.state == HALF_OPEN and admitted(b, probe)
    return b


# --- closed ------------------------------------------------------------------------


def test_a_new_breaker_is_closed_and_never_opened() -> None:
    """A provider nobody has reported on is usable, with no slow start pending."""
    b = Breaker()
    assert b.state == CLOSED and b.opened_at is None and b.closed_at is None
    assert view(b, 0.0, CFG) == CLOSED
    assert (b.total_failures, b.total_successes, b.opens) == (0, 0, 0)


def test_failures_below_the_threshold_keep_it_closed() -> None:
    """A few failures are tolerated: calls keep going to the provider."""
    b, moved = fold([Failure(1.0), Failure(2.0)])
    assert b.state == CLOSED
    assert b.failures == (1.0, 2.0)
    assert b.total_failures == 2
    assert moved == []


def test_threshold_failures_within_the_window_open_it() -> None:
    """The threshold-th failure inside the window opens the breaker, at that failure's time."""
    b, moved = fold([Failure(1.0), Failure(2.0), Failure(3.0)])
    assert b.state == OPEN
    assert b.opened_at == 3.0
    assert b.failures == ()
    assert b.opens == 1 and b.total_failures == 3
    assert moved == [Transition(CLOSED, OPEN, 3.0, "3 failures in 60s")]


def test_failures_older_than_the_window_are_forgotten() -> None:
    """Failures spread thinner than the threshold per window never open the breaker."""
    b, moved = fold([Failure(0.0), Failure(30.0), Failure(61.0)])
    assert b.state == CLOSED
    assert b.failures == (30.0, 61.0)
    assert b.total_failures == 3
    assert moved == []
    b, moved = fold([Failure(62.0)], b=b)
    assert b.state == OPEN and moved[0].at == 62.0


def test_a_failure_exactly_window_s_old_is_out_of_the_window() -> None:
    """The window is (at - window_s, at]: a failure exactly window_s old no longer counts."""
    b, _ = fold([Failure(0.0), Failure(0.0), Failure(60.0)])
    assert b.state == CLOSED
    assert b.failures == (60.0,)


def test_successes_do_not_forgive_failures_in_the_window() -> None:
    """It counts failures in a sliding window, so a success between failures doesn't reset the count."""
    b, moved = fold([Failure(1.0), Success(1.5), Failure(2.0), Success(2.5), Failure(3.0)])
    assert b.state == OPEN
    assert b.total_successes == 2
    assert [m.to for m in moved] == [OPEN]


def test_success_when_closed_only_counts() -> None:
    """A success on a closed breaker changes nothing but the operator counter."""
    b, _ = fold([Failure(1.0)])
    after, moved = step(b, Success(2.0), CFG)
    assert after == Breaker(failures=(1.0,), total_failures=1, total_successes=1)
    assert moved == []


def test_probe_request_when_closed_is_not_admitted() -> None:
    """A closed breaker needs no probe: the request changes nothing and admits nothing."""
    b, _ = fold([Failure(1.0)])
    after, moved = step(b, ProbeRequest(2.0, "p1"), CFG)
    assert after == b
    assert moved == []
    assert not admitted(after, "p1")


def test_a_late_failure_counts_against_the_latest_failure_seen() -> None:
    """A report delivered late (its worker's clock behind) counts if it is inside the window of the newest failure."""
    b, _ = fold([Failure(100.0), Failure(50.0)])
    assert b.state == CLOSED
    assert b.failures == (50.0, 100.0)
    b, moved = fold([Failure(45.0)], b=b)
    assert b.state == OPEN
    assert moved == [Transition(CLOSED, OPEN, 100.0, "3 failures in 60s")]


def test_a_late_failure_never_dates_the_opening_back() -> None:
    """An opening triggered by a late report is stamped with the newest failure, so the open timeout is not cut short."""
    b, _ = fold([Failure(100.0), Failure(101.0), Failure(70.0)])
    assert b.state == OPEN
    assert b.opened_at == 101.0
    assert reopens_at(b, CFG) == 131.0


def test_a_failure_older_than_the_window_does_not_evict_newer_ones() -> None:
    """A very stale report neither counts nor pushes newer failures out of the window."""
    b, moved = fold([Failure(100.0), Failure(101.0), Failure(0.0)])
    assert b.state == CLOSED
    assert b.failures == (100.0, 101.0)
    assert b.total_failures == 3
    assert moved == []


# --- open ----------------------------------------------------------------------------


def test_reports_while_open_only_count() -> None:
    """Calls that were in flight when it opened report late; they change only the counters."""
    b = opened(100.0)
    after, moved = fold([Failure(110.0), Success(111.0), Failure(112.0, "p9"), Success(113.0, "p9")], b=b)
    assert after == Breaker(
        state=OPEN, opened_at=100.0, total_failures=b.total_failures + 2, total_successes=2, opens=1
    )
    assert moved == []


def test_probes_are_denied_before_the_open_timeout() -> None:
    """An open breaker sends no traffic at all until open_timeout_s has passed."""
    b = opened(100.0)
    after, moved = step(b, ProbeRequest(129.999, "p1"), CFG)
    assert after == b
    assert moved == []
    assert not admitted(after, "p1")


def test_the_first_event_past_the_timeout_moves_it_to_half_open() -> None:
    """After open_timeout_s the next event sees a half-open breaker, stamped at the timeout, not at the event."""
    b = opened(100.0)
    after, moved = step(b, ProbeRequest(130.0, "p1"), CFG)
    assert after.state == HALF_OPEN
    assert admitted(after, "p1")
    assert after.probes == (("p1", 130.0),)
    assert moved == [Transition(OPEN, HALF_OPEN, 130.0, "open_timeout 30s elapsed")]
    _, moved = step(b, ProbeRequest(500.0, "p1"), CFG)
    assert moved == [Transition(OPEN, HALF_OPEN, 130.0, "open_timeout 30s elapsed")]


def test_a_stale_report_past_the_timeout_moves_it_to_half_open_and_counts() -> None:
    """A non-probe report after the timeout still carries the half-open transition but is otherwise only counted."""
    b = opened(100.0)
    after, moved = step(b, Failure(140.0), CFG)
    assert after.state == HALF_OPEN
    assert after.total_failures == b.total_failures + 1
    assert after.opens == 1
    assert moved == [Transition(OPEN, HALF_OPEN, 130.0, "open_timeout 30s elapsed")]
    after, moved = step(b, Success(140.0), CFG)
    assert after.state == HALF_OPEN and after.successes == 0 and after.total_successes == 1
    assert [m.to for m in moved] == [HALF_OPEN]


# --- half-open -----------------------------------------------------------------------


def test_only_half_open_probes_are_admitted_at_once() -> None:
    """With one probe in flight, a second worker's probe is denied: the provider sees one call."""
    b = half_open(100.0, "p1")
    after, moved = step(b, ProbeRequest(131.0, "p2"), CFG)
    assert after == b
    assert moved == []
    assert admitted(after, "p1") and not admitted(after, "p2")


def test_half_open_probes_sets_how_many_run_at_once() -> None:
    """With half_open_probes=3, three probes are admitted and the fourth waits."""
    cfg = CFG.model_copy(update={"half_open_probes": 3})
    b = opened(100.0, cfg)
    b, _ = fold([ProbeRequest(130.0 + i, f"p{i}") for i in range(4)], cfg, b)
    assert [pid for pid, _ in b.probes] == ["p0", "p1", "p2"]
    assert not admitted(b, "p3")


def test_a_duplicate_probe_request_is_idempotent() -> None:
    """A worker asking again for the probe it already holds keeps it, with its first admission time."""
    b = half_open(100.0, "p1")
    after, moved = step(b, ProbeRequest(135.0, "p1"), CFG)
    assert after == b
    assert after.probes == (("p1", 130.0),)
    assert moved == []


def test_a_probe_that_never_reports_frees_its_place_after_probe_timeout() -> None:
    """If a probe's worker dies, another worker may probe once probe_timeout_s has passed."""
    b = half_open(100.0, "p1")  # admitted at 130
    held, _ = step(b, ProbeRequest(190.0, "p2"), CFG)
    assert held == b  # exactly probe_timeout_s later: still in flight
    freed, _ = step(b, ProbeRequest(190.001, "p2"), CFG)
    assert freed.probes == (("p2", 190.001),)
    assert not admitted(freed, "p1")


def test_an_expired_probe_can_be_readmitted_under_its_own_id() -> None:
    """A worker re-asking after its probe timed out gets a fresh admission, not a stale one."""
    b = half_open(100.0, "p1")
    after, _ = step(b, ProbeRequest(200.0, "p1"), CFG)
    assert after.probes == (("p1", 200.0),)


def test_a_probe_success_frees_its_place_and_counts() -> None:
    """A successful probe below success_threshold lets the next probe through."""
    b = half_open(100.0, "p1")
    b, moved = step(b, Success(131.0, "p1"), CFG)
    assert b.state == HALF_OPEN
    assert b.successes == 1 and b.probes == ()
    assert b.total_successes == 1
    assert moved == []
    b, _ = step(b, ProbeRequest(132.0, "p2"), CFG)
    assert admitted(b, "p2")


def test_success_threshold_probe_successes_close_it() -> None:
    """After success_threshold successful probes the provider gets traffic again, from closed_at."""
    b = half_open(100.0, "p1")
    b, moved = fold([Success(131.0, "p1"), ProbeRequest(132.0, "p2"), Success(133.0, "p2")], b=b)
    assert b.state == CLOSED
    assert b.closed_at == 133.0
    assert (b.failures, b.successes, b.probes) == ((), 0, ())
    assert b.total_successes == 2
    assert moved == [Transition(HALF_OPEN, CLOSED, 133.0, "2 probe successes")]


def test_one_required_success_reads_singular() -> None:
    """The reason an operator reads is proper English for a threshold of one."""
    cfg = CFG.model_copy(update={"success_threshold": 1, "failure_threshold": 1})
    b = half_open(100.0, "p1", cfg)
    _, moved = step(b, Success(131.0, "p1"), cfg)
    assert moved == [Transition(HALF_OPEN, CLOSED, 131.0, "1 probe success")]
    _, moved = step(Breaker(), Failure(1.0), cfg)
    assert moved == [Transition(CLOSED, OPEN, 1.0, "1 failure in 60s")]


def test_a_closed_breaker_starts_a_fresh_failure_window() -> None:
    """Failures from before the outage don't count after it closes: it takes the full threshold to reopen."""
    b = half_open(100.0, "p1")
    b, _ = fold([Success(131.0, "p1"), ProbeRequest(132.0, "p2"), Success(133.0, "p2")], b=b)
    b, _ = fold([Failure(134.0), Failure(135.0)], b=b)
    assert b.state == CLOSED
    b, _ = fold([Failure(136.0)], b=b)
    assert b.state == OPEN and b.opens == 2


def test_a_probe_failure_reopens_it() -> None:
    """One failed probe sends the breaker back to open, with a fresh open timeout from the failure."""
    b = half_open(100.0, "p1")
    b, _ = step(b, Success(131.0, "p1"), CFG)
    b, _ = step(b, ProbeRequest(132.0, "p2"), CFG)
    b, moved = step(b, Failure(133.0, "p2"), CFG)
    assert b.state == OPEN
    assert b.opened_at == 133.0
    assert (b.successes, b.probes) == (0, ())
    assert b.opens == 2
    assert reopens_at(b, CFG) == 163.0
    assert moved == [Transition(HALF_OPEN, OPEN, 133.0, "probe failed")]


def test_after_reopening_old_probe_ids_are_not_admitted() -> None:
    """A probe admitted in an earlier half-open window can't report into the next one."""
    cfg = CFG.model_copy(update={"half_open_probes": 2})
    b = opened(100.0, cfg)
    b, _ = fold([ProbeRequest(130.0, "p1"), ProbeRequest(130.0, "p2"), Failure(131.0, "p1")], cfg, b)
    assert b.state == OPEN
    assert not admitted(b, "p2")
    b, _ = fold([ProbeRequest(161.0, "p3"), Success(162.0, "p2"), Success(163.0, "p2")], cfg, b)
    assert b.state == HALF_OPEN
    assert b.successes == 0


@pytest.mark.parametrize("report", [Success, Failure])
@pytest.mark.parametrize("probe_id", [None, "stranger"])
def test_a_report_from_no_admitted_probe_only_counts_in_half_open(report: type, probe_id: str | None) -> None:
    """A stale call (no probe id, or one never admitted) must not close or reopen a half-open breaker."""
    b = half_open(100.0, "p1")
    after, moved = step(b, report(131.0, probe_id), CFG)
    assert after.state == HALF_OPEN
    assert (after.successes, after.probes, after.opens) == (b.successes, b.probes, b.opens)
    assert after.total_failures + after.total_successes == b.total_failures + b.total_successes + 1
    assert moved == []


def test_a_probe_reporting_twice_counts_once() -> None:
    """A duplicated success report (redelivery) can't close the breaker on its own."""
    b = half_open(100.0, "p1")
    b, moved = fold([Success(131.0, "p1"), Success(131.0, "p1")], b=b)
    assert b.state == HALF_OPEN
    assert b.successes == 1
    assert b.total_successes == 2
    assert moved == []


# --- view, reopens_at, admitted, as_dict ---------------------------------------------


@pytest.mark.parametrize(
    ("now", "expected"),
    [(100.0, OPEN), (129.999, OPEN), (130.0, HALF_OPEN), (130.001, HALF_OPEN), (10_000.0, HALF_OPEN)],
)
def test_view_reads_half_open_once_the_open_timeout_elapsed(now: float, expected: str) -> None:
    """Callers see half-open as soon as the timeout elapses, before any event records it."""
    assert view(opened(100.0), now, CFG) == expected


@pytest.mark.parametrize("offset", [-0.001, 0.0, 0.001, 5.0])
def test_view_agrees_with_what_step_would_do(offset: float) -> None:
    """What a worker reads from view() at t is the state the next event at t is applied in."""
    b = opened(100.0)
    at = 130.0 + offset
    after, _ = step(b, ProbeRequest(at, "p1"), CFG)
    assert after.state == view(b, at, CFG)


@pytest.mark.parametrize("state", [CLOSED, HALF_OPEN])
def test_view_of_a_breaker_that_is_not_open_is_its_state(state: str) -> None:
    """Only an open breaker changes with the clock; closed and half-open read as they are."""
    b = Breaker(state=state, opened_at=0.0)
    assert view(b, 0.0, CFG) == state
    assert view(b, 1e9, CFG) == state


def test_reopens_at_is_the_end_of_the_open_timeout_only_when_open() -> None:
    """Operators and callers learn when an open breaker lets probes through; other states have no such time."""
    assert reopens_at(opened(100.0), CFG) == 130.0
    assert reopens_at(Breaker(), CFG) is None
    assert reopens_at(half_open(100.0, "p1"), CFG) is None


def test_admitted_only_for_probes_held_in_half_open() -> None:
    """A worker may send a probe only when its own id is in flight in a half-open breaker."""
    assert admitted(half_open(100.0, "p1"), "p1")
    assert not admitted(half_open(100.0, "p1"), "p2")
    assert not admitted(opened(100.0), "p1")
    assert not admitted(Breaker(), "p1")


def test_as_dict_is_json_and_reads_the_state_at_now() -> None:
    """/circuits shows every counter and the effective state, as plain JSON."""
    b = opened(100.0)
    d = as_dict(b, 110.0, CFG)
    assert d == {
        "state": OPEN,
        "failures_in_window": 0,
        "opened_at": 100.0,
        "closed_at": None,
        "successes": 0,
        "probes_in_flight": 0,
        "total_failures": 3,
        "total_successes": 0,
        "opens": 1,
        "reopens_at": 130.0,
    }
    assert json.loads(json.dumps(d)) == d
    later = as_dict(b, 130.0, CFG)
    assert later["state"] == HALF_OPEN
    assert later["reopens_at"] is None


def test_as_dict_counts_only_failures_still_in_the_window() -> None:
    """failures_in_window is what could still open the breaker at ``now``, not every failure ever."""
    b, _ = fold([Failure(0.0), Failure(50.0)])
    assert as_dict(b, 55.0, CFG)["failures_in_window"] == 2
    assert as_dict(b, 60.0, CFG)["failures_in_window"] == 1
    assert as_dict(b, 200.0, CFG)["failures_in_window"] == 0


def test_as_dict_shows_probes_in_flight() -> None:
    """Operators can see that a half-open breaker has a probe out."""
    d = as_dict(half_open(100.0, "p1"), 131.0, CFG)
    assert d["state"] == HALF_OPEN
    assert d["probes_in_flight"] == 1


# --- adopt ---------------------------------------------------------------------------


def test_adopt_syncs_a_joining_worker_to_an_open_breaker() -> None:
    """A worker that joins late takes the breaker state another worker recorded, keeping its own counters."""
    b, _ = fold([Failure(1.0), Success(2.0)])
    after, moved = step(b, Adopt(50.0, OPEN, opened_at=40.0, closed_at=None), CFG)
    assert after == Breaker(state=OPEN, opened_at=40.0, total_failures=1, total_successes=1)
    assert moved == [Transition(CLOSED, OPEN, 50.0, "adopted")]
    assert reopens_at(after, CFG) == 70.0


def test_adopting_the_same_state_emits_no_transition_but_resets_the_window() -> None:
    """Adopting the state it is already in is not a transition, but its partial counts start afresh."""
    b, _ = fold([Failure(1.0), Failure(2.0)])
    after, moved = step(b, Adopt(3.0, CLOSED, opened_at=None, closed_at=None), CFG)
    assert moved == []
    assert after.failures == ()
    assert after.total_failures == 2


def test_adopt_closed_drops_half_open_probes() -> None:
    """After adopting closed, no probe of the old half-open window stays admitted."""
    b = half_open(100.0, "p1")
    after, moved = step(b, Adopt(131.0, CLOSED, opened_at=100.0, closed_at=131.0), CFG)
    assert after.state == CLOSED and after.closed_at == 131.0
    assert after.probes == () and after.successes == 0
    assert not admitted(after, "p1")
    assert moved == [Transition(HALF_OPEN, CLOSED, 131.0, "adopted")]


def test_adopt_replaces_without_applying_the_open_timeout_first() -> None:
    """Adopt is taken as recorded: an elapsed timeout of the old state is not applied before it."""
    b = opened(100.0)
    after, moved = step(b, Adopt(200.0, OPEN, opened_at=190.0, closed_at=None), CFG)
    assert moved == []
    assert after.state == OPEN and after.opened_at == 190.0
    assert view(after, 200.0, CFG) == OPEN


def test_adopt_half_open_then_probes_work() -> None:
    """A worker that adopted half-open admits probes like one that got there itself."""
    b, moved = step(Breaker(), Adopt(10.0, HALF_OPEN, opened_at=0.0, closed_at=None), CFG)
    assert moved == [Transition(CLOSED, HALF_OPEN, 10.0, "adopted")]
    b, _ = step(b, ProbeRequest(11.0, "p1"), CFG)
    assert admitted(b, "p1")


def test_malformed_states_are_refused_at_construction() -> None:
    """An unknown state or an open breaker without opened_at is a bug, caught where it is made."""
    with pytest.raises(ValueError, match="unknown breaker state"):
        Adopt(1.0, "ajar", opened_at=None, closed_at=None)
    with pytest.raises(ValueError, match="opened_at"):
        Adopt(1.0, OPEN, opened_at=None, closed_at=None)
    with pytest.raises(ValueError, match="opened_at"):
        Breaker(state=OPEN)


def test_step_refuses_what_is_not_an_event() -> None:
    """Folding something that isn't a breaker event fails loudly instead of being ignored."""
    with pytest.raises(TypeError, match="not a breaker event"):
        step(Breaker(), "failure", CFG)  # type: ignore[arg-type]


def test_breakers_and_events_are_immutable() -> None:
    """step returns a new breaker; the one a table holds is never changed in place."""
    b = Breaker()
    with pytest.raises(FrozenInstanceError):
        b.state = OPEN  # type: ignore[misc]
    after, _ = step(b, Failure(1.0), CFG)
    assert b == Breaker() and after is not b


# --- properties ------------------------------------------------------------------------

configs = st.builds(
    BreakerConfig,
    failure_threshold=st.integers(1, 5),
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
    assert len(after.failures) < cfg.failure_threshold
    assert after.successes < cfg.success_threshold
    # Counters are monotonic and count every report exactly once.
    assert after.total_failures - before.total_failures == isinstance(event, Failure)
    assert after.total_successes - before.total_successes == isinstance(event, Success)
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
    cfg=configs,
    start=st.floats(0.0, 1000.0),
    gaps=st.lists(st.one_of(st.just(0.0), st.floats(0.0, 30.0)), min_size=1, max_size=40),
)
def test_a_failing_provider_opens_at_exactly_the_threshold_th_failure(
    cfg: BreakerConfig, start: float, gaps: list[float]
) -> None:
    """A provider whose every call fails has at most failure_threshold failures counted before the breaker opens."""
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
    """Workers that probe only when admitted send a dead provider at most half_open_probes calls per half-open window."""
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
        self.failures_since_close: list[float] = []
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
        self.failures_since_close, self.successes, self.probes = [], 0, {}

    def in_window(self) -> int:
        if not self.failures_since_close:
            return 0
        latest = max(self.failures_since_close)
        return sum(1 for t in self.failures_since_close if t > latest - self.cfg.window_s)

    def failure(self, at: float, pid: str | None) -> None:
        self.tick(at)
        self.total_failures += 1
        if self.state == CLOSED:
            self.failures_since_close.append(at)
            if self.in_window() >= self.cfg.failure_threshold:
                self.open(max(self.failures_since_close))
        elif self.state == HALF_OPEN and pid in self.probes:
            self.open(at)

    def success(self, at: float, pid: str | None) -> None:
        self.tick(at)
        self.total_successes += 1
        if self.state == HALF_OPEN and pid in self.probes:
            del self.probes[pid]
            self.successes += 1
            if self.successes >= self.cfg.success_threshold:
                self.state, self.closed_at, self.successes, self.probes = CLOSED, at, 0, {}
                self.failures_since_close = []

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
        self.failures_since_close, self.successes, self.probes = [], 0, {}


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

    @rule(**times, pid=report_ids)
    def success(self, gap: float, late: float, pid: str | None) -> None:
        at = self.at(gap, late)
        self.apply(Success(at, pid))
        self.ref.success(at, pid)

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


def test_a_cancelled_probe_frees_its_place_without_counting() -> None:
    """A probe whose worker gave it back (verdict too late, shutdown) frees the half-open place at once and counts for nothing."""
    cfg = BreakerConfig(failure_threshold=1, open_timeout_s=10, half_open_probes=1)
    b, _ = breaker.step(breaker.Breaker(), breaker.Failure(at=0.0), cfg)
    b, _ = breaker.step(b, breaker.ProbeRequest(at=11.0, probe_id="p1"), cfg)
    assert breaker.admitted(b, "p1")
    b, _ = breaker.step(b, breaker.ProbeRequest(at=11.5, probe_id="p2"), cfg)
    assert not breaker.admitted(b, "p2"), "one place only"
    b, moved = breaker.step(b, breaker.ProbeCancel(at=12.0, probe_id="p1"), cfg)
    assert moved == [] and b.state == breaker.HALF_OPEN and b.successes == 0 and b.probes == ()
    b, _ = breaker.step(b, breaker.ProbeRequest(at=12.1, probe_id="p2"), cfg)
    assert breaker.admitted(b, "p2")
