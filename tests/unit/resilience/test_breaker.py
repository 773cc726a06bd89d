"""The circuit breaker: a pure state machine folded from one ordered event log (closed, open, half-open)."""

from __future__ import annotations

import pytest

from agents_stream.config import BreakerConfig
from agents_stream.resilience import breaker
from agents_stream.resilience.breaker import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    Breaker,
    Failure,
    ProbeRequest,
    Success,
    Transition,
    admitted,
    reopens_at,
    step,
    view,
)
from tests.unit.breaker_helpers import CFG, fold, half_open, opened

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
    assert moved == [Transition(CLOSED, OPEN, 3.0, "3 failures in a row")]


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


def test_a_success_ends_the_run_of_failures() -> None:
    """Failures open it only in a row: a success between failures starts the run again."""
    b, moved = fold([Failure(1.0), Success(1.5), Failure(2.0), Success(2.5), Failure(3.0)])
    assert b.state == CLOSED
    assert b.failures == (3.0,)
    assert b.total_successes == 2 and b.total_failures == 3
    assert moved == []


def test_at_one_time_the_order_of_the_log_decides_what_ends_a_run() -> None:
    """The broker dates a whole batch with one time: a success folded after failures of that time ends their run,
    and a failure folded after a success of its time starts a new one (not a run with the failures before)."""
    same = 5.0
    b, moved = fold([Failure(same), Success(same), Failure(same), Success(same), Failure(same)])
    assert b.state == CLOSED and b.failures == (same,) and moved == []
    late, _ = fold([Failure(same), Success(same), Failure(same), Success(4.0)])
    assert late.failures == (same,), "a success of an earlier time ends no run of later failures"


def test_success_when_closed_counts_and_ends_the_run() -> None:
    """A success on a closed breaker ends the run and counts in the rate window; nothing opens or closes."""
    b, _ = fold([Failure(1.0)])
    after, moved = step(b, Success(2.0, count=4), CFG)
    assert after.state == CLOSED and after.failures == ()
    assert after.last_success_at == 2.0
    assert (after.total_failures, after.total_successes) == (1, 4)
    assert sum(s for _, s, _ in after.window) == 4 and sum(f for _, _, f in after.window) == 1
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
    assert moved == [Transition(CLOSED, OPEN, 100.0, "3 failures in a row")]


def test_a_late_failure_never_dates_the_opening_back() -> None:
    """An opening triggered by a late report is stamped with the newest failure,
    so the open timeout is not cut short."""
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
    assert moved == [Transition(CLOSED, OPEN, 1.0, "1 failure in a row")]


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


def test_a_cancelled_probe_frees_its_place_without_counting() -> None:
    """A probe whose worker gave it back (verdict too late, shutdown) frees the half-open place at once
    and counts for nothing."""
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
