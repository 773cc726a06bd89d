"""backoff(): the retry delay as a pure function, its randomness passed in."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents_stream.resilience.backoff import backoff


def test_ceiling_doubles_from_base() -> None:
    """Without jitter the delay starts at ``base`` and doubles each attempt."""
    got = [backoff(n, base=0.5, cap=1000.0, jitter=False) for n in range(1, 8)]
    assert got == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0]


def test_first_retry_waits_base_with_other_base() -> None:
    """``base`` is the first delay, not a hard-coded 0.5."""
    assert backoff(1, base=2.0, cap=1000.0, jitter=False) == 2.0
    assert backoff(3, base=2.0, cap=1000.0, jitter=False) == 8.0


def test_cap_bounds_the_delay() -> None:
    """However many retries, the delay never exceeds ``cap``."""
    assert backoff(50, base=0.5, cap=30, jitter=False) == 30
    assert backoff(7, base=0.5, cap=30, jitter=False) == 30  # 0.5 * 64 = 32 > 30
    assert backoff(6, base=0.5, cap=30, jitter=False) == 16


def test_huge_attempt_does_not_overflow() -> None:
    """A task retried for ever still gets the cap, not an OverflowError or inf."""
    assert backoff(10**6, base=0.5, cap=30.0, jitter=False) == 30.0
    rng = random.Random(1)
    assert 15.0 <= backoff(10**6, base=0.5, cap=30.0, rng=rng) <= 30.0


@pytest.mark.parametrize("attempt", [1, 2, 3, 5, 8, 20])
def test_jitter_stays_within_half_ceiling_and_ceiling(attempt: int) -> None:
    """Jittered delays lie in [ceiling/2, ceiling], so retries spread out but still grow."""
    ceiling = min(30.0, 0.5 * 2 ** (attempt - 1))
    rng = random.Random(attempt)
    draws = [backoff(attempt, base=0.5, cap=30.0, rng=rng) for _ in range(500)]
    assert all(ceiling / 2 <= d <= ceiling for d in draws)
    # Actually random: many distinct values across the band, not one fixed point.
    assert len(set(draws)) > 100
    assert min(draws) < ceiling * 0.6 and max(draws) > ceiling * 0.9


def test_jitter_is_reproducible_with_a_seeded_rng() -> None:
    """The randomness comes only from the rng passed in, so a seed reproduces the schedule."""
    a = [backoff(n, rng=random.Random(42)) for n in range(1, 10)]
    b = [backoff(n, rng=random.Random(42)) for n in range(1, 10)]
    assert a == b


def test_retry_after_is_a_floor_even_above_cap() -> None:
    """A provider's Retry-After is honoured even when it exceeds the cap."""
    assert backoff(1, base=0.5, cap=30.0, jitter=False, retry_after=100.0) == 100.0
    assert backoff(1, base=0.5, cap=30.0, retry_after=100.0, rng=random.Random(0)) == 100.0


def test_retry_after_below_delay_does_not_shorten_it() -> None:
    """A small Retry-After does not make us come back sooner than the backoff says."""
    assert backoff(6, base=0.5, cap=30.0, jitter=False, retry_after=1.0) == 16.0
    assert backoff(6, base=0.5, cap=30.0, jitter=False, retry_after=0.0) == 16.0


@pytest.mark.parametrize("attempt", [0, -1, -100])
def test_attempt_below_one_is_rejected(attempt: int) -> None:
    """Attempts count from 1; anything lower is a caller bug and raises ValueError."""
    with pytest.raises(ValueError, match="attempt"):
        backoff(attempt)


@given(
    attempt=st.integers(min_value=1, max_value=200),
    retry_after=st.none() | st.floats(min_value=0, max_value=1000, allow_nan=False),
    jitter=st.booleans(),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_delay_is_bounded_and_honours_retry_after(
    attempt: int, retry_after: float | None, jitter: bool, seed: int
) -> None:
    """For any attempt and Retry-After the delay is in the jitter band (or the Retry-After)
    and never below Retry-After."""
    base, cap = 0.5, 30.0
    ceiling = min(cap, base * 2 ** (attempt - 1))
    floor = retry_after or 0.0
    d = backoff(attempt, base=base, cap=cap, jitter=jitter, retry_after=retry_after, rng=random.Random(seed))
    low = ceiling / 2 if jitter else ceiling
    assert max(low, floor) <= d <= max(ceiling, floor)
    if retry_after is not None:
        assert d >= retry_after
