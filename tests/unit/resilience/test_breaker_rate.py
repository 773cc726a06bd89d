"""The breaker tells a degraded provider from a dead one: failures in a row or a failure rate
over the window open it; a provider that fails one call in ten never does."""

from __future__ import annotations

import random

import pytest

from agents_stream.config import BreakerConfig
from agents_stream.resilience.breaker import (
    CLOSED,
    OPEN,
    Breaker,
    Event,
    Failure,
    Success,
    longest_run,
    run_needed,
    step,
)
from tests.unit.breaker_helpers import fold

DEFAULT = BreakerConfig()


def calls(n: int, error_rate: float, *, start: float, per_second: float, seed: int) -> list[tuple[float, bool]]:
    """``n`` calls at ``per_second``, each failing with ``error_rate`` (seeded): (time, succeeded)."""
    rng = random.Random(seed)
    return [(start + i / per_second, rng.random() >= error_rate) for i in range(n)]


def reports(outcomes: list[tuple[float, bool]], workers: int, report_s: float) -> list[Event]:
    """The log several workers write for these calls, as the circuits do: a failure at once, with the worker's
    successes since its last report just before it; otherwise a count of successes every ``report_s``."""
    log: list[Event] = []
    pending = [0] * workers
    last_ok = [0.0] * workers
    flushed = [outcomes[0][0] if outcomes else 0.0] * workers
    for i, (at, ok) in enumerate(outcomes):
        w = i % workers
        if ok:
            pending[w] += 1
            last_ok[w] = at
        if pending[w] and (not ok or at - flushed[w] >= report_s):
            log.append(Success(last_ok[w], count=pending[w]))
            pending[w], flushed[w] = 0, at
        if not ok:
            log.append(Failure(at))
    return log


def first_open(log: list[Event], cfg: BreakerConfig = DEFAULT, b: Breaker | None = None) -> int | None:
    """The index of the event that opened the breaker, or None."""
    b = b or Breaker()
    for i, event in enumerate(log):
        b, moved = step(b, event, cfg)
        if any(m.to == OPEN for m in moved):
            return i
    return None


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_provider_failing_one_call_in_ten_never_opens_it_with_every_success_reported(seed: int) -> None:
    """100,000 calls at 300/s, 10% answered 500, every success its own report: the breaker stays closed."""
    log: list[Event] = [
        Success(at) if ok else Failure(at)
        for at, ok in calls(100_000, 0.1, start=0.0, per_second=300, seed=seed)
    ]
    assert first_open(log) is None


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_provider_failing_one_call_in_ten_never_opens_it_with_successes_reported_in_counts(seed: int) -> None:
    """The same with two workers reporting their successes in counts (each second, and before each failure)."""
    log = reports(calls(100_000, 0.1, start=0.0, per_second=300, seed=seed), workers=2, report_s=1.0)
    assert first_open(log) is None
    assert sum(1 for e in log if isinstance(e, Success)) < 0.15 * 100_000, "the log holds far fewer records than calls"


def test_a_healthy_provider_that_dies_opens_at_failure_threshold_in_a_row() -> None:
    """A minute of successes, then every call fails: the failure_threshold-th failure opens it (the call bound)."""
    healthy = reports(calls(18_000, 0.0, start=0.0, per_second=300, seed=0), workers=2, report_s=1.0)
    dead = [Failure(60.0 + i * 0.01) for i in range(20)]
    at = first_open(healthy + dead)
    assert at == len(healthy) + DEFAULT.failure_threshold - 1


def test_a_degraded_provider_that_dies_opens_within_the_run_its_error_rate_allows() -> None:
    """A provider failing 10% of calls that dies opens after the run 10% would not produce by chance (9), within
    longest_run."""
    degraded = reports(calls(18_000, 0.1, start=0.0, per_second=300, seed=4), workers=2, report_s=1.0)
    dead = [Failure(60.0 + i * 0.01) for i in range(40)]
    at = first_open(degraded + dead)
    assert at is not None and at - len(degraded) + 1 <= 9 <= longest_run(DEFAULT)


def test_a_failure_rate_over_the_threshold_opens_it_once_the_window_has_minimum_calls() -> None:
    """Every other call failing (no run ever reaches the threshold) opens it by the rate, once the window holds
    minimum_calls calls, and not before."""
    cfg = BreakerConfig(failure_threshold=3, failure_rate_threshold=0.5, minimum_calls=20)
    pattern = [False, True, True, False]  # failures two in a row at most
    log: list[Event] = [Success(float(i)) if pattern[i % 4] else Failure(float(i)) for i in range(40)]
    b, moved = fold(log[:19], cfg)
    assert b.state == CLOSED and moved == [], "19 calls: below minimum_calls"
    b, moved = fold(log[19:20], cfg, b)
    assert b.state == OPEN
    assert moved[0].reason == "failure rate 50% of 20 calls in 60s"


def test_a_failure_rate_below_the_threshold_keeps_it_closed() -> None:
    """Three failures in ten, never three in a row: closed, however many calls."""
    cfg = BreakerConfig(failure_threshold=3, failure_rate_threshold=0.5, minimum_calls=20)
    pattern = [True, False, True, False, True, True, False, True, True, True]
    log: list[Event] = [Success(i * 0.1) if pattern[i % 10] else Failure(i * 0.1) for i in range(2000)]
    b, moved = fold(log, cfg)
    assert b.state == CLOSED and moved == []


def test_a_late_success_ends_only_the_failures_before_it() -> None:
    """A success reported late (a worker's count) ends the run up to its own time; later failures stay."""
    cfg = BreakerConfig(failure_threshold=3)
    b, _ = fold([Failure(4.0), Failure(6.0), Success(5.0, count=3)], cfg)
    assert b.failures == (6.0,)
    b, moved = fold([Failure(7.0)], cfg, b)
    assert b.state == CLOSED and b.failures == (6.0, 7.0) and moved == []


def test_the_run_needed_grows_with_the_error_rate_the_window_shows() -> None:
    """failure_threshold for a provider with no failures or too few calls; 9 at 10%; longest just below the rate
    threshold."""
    assert run_needed(1000, 0, DEFAULT) == DEFAULT.failure_threshold
    assert run_needed(5, 5, DEFAULT) == DEFAULT.failure_threshold, "below minimum_calls: the rate is not known"
    assert run_needed(900, 100, DEFAULT) == 9
    assert run_needed(600, 400, DEFAULT) <= longest_run(DEFAULT) == 28


def test_a_success_report_stands_for_at_least_one_call() -> None:
    """A count of zero is not a report."""
    with pytest.raises(ValueError, match="at least one call"):
        Success(1.0, count=0)
