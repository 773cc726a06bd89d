"""The circuit breaker's views (view, reopens_at, admitted, as_dict), adoption and construction."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError

import pytest

from agents_stream.resilience.breaker import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    Adopt,
    Breaker,
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
from tests.unit.breaker_helpers import CFG, fold, half_open, opened

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
        "calls_in_window": 0,
        "failure_rate": None,
        "failures_in_a_row_to_open": 3,
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
