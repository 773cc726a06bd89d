"""Pure limits: the token bucket, a worker's share of a cluster limit, the slow-start ramp."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agents_stream.resilience.ratelimit import TokenBucket, ramp, rebucket, share, take


def slack(rate: float) -> float:
    """What a bound on admitted calls may be off by: the crumb of a token lent to a caller
    that comes back a microsecond early (see ``_EARLY_S``), plus float rounding."""
    return rate * 1e-6 + 1e-9


def take_all(bucket: TokenBucket, times: list[float]) -> tuple[TokenBucket, list[float]]:
    """Take once at each time in turn; return the final bucket and the times admitted."""
    admitted = []
    for now in times:
        bucket, wait = take(bucket, now)
        if wait == 0.0:
            admitted.append(now)
    return bucket, admitted


# --- token bucket --------------------------------------------------------------------


def test_a_full_bucket_admits_a_burst_then_says_how_long_to_wait() -> None:
    """A quiet caller may send ``burst`` calls at once; the next one learns when a token is due."""
    bucket = TokenBucket.full(rate=2.0, burst=3, now=10.0)
    waits = []
    for _ in range(4):
        bucket, wait = take(bucket, 10.0)
        waits.append(wait)
    assert waits == [0.0, 0.0, 0.0, 0.5]
    assert bucket.tokens == 0.0 and bucket.updated == 10.0


def test_tokens_refill_at_rate() -> None:
    """An emptied bucket earns rate tokens per second again."""
    bucket, _ = take_all(TokenBucket.full(rate=2.0, burst=2, now=0.0), [0.0, 0.0])
    _, admitted = take_all(bucket, [0.25, 0.5, 0.75, 1.0, 1.0])
    assert admitted == [0.5, 1.0]


def test_refill_never_exceeds_burst() -> None:
    """A long idle spell banks at most ``burst`` tokens, so the next burst is still bounded."""
    bucket, admitted = take_all(TokenBucket.full(rate=1.0, burst=2, now=0.0), [0.0, 0.0, 1000.0, 1000.0, 1000.0])
    assert admitted == [0.0, 0.0, 1000.0, 1000.0]
    assert bucket.tokens == 0.0


def test_a_denied_take_returns_the_refilled_bucket_untouched() -> None:
    """A denied call takes nothing, but the bucket it returns is brought up to ``now``."""
    empty = TokenBucket(rate=1.0, burst=5, tokens=0.0, updated=0.0)
    bucket, wait = take(empty, 0.4)
    assert (bucket.tokens, bucket.updated) == (pytest.approx(0.4), 0.4)
    assert wait == pytest.approx(0.6)


def test_taking_at_now_plus_wait_is_admitted() -> None:
    """A caller who sleeps exactly the wait it was told gets in, and not a moment sooner."""
    bucket = TokenBucket(rate=3.0, burst=1, tokens=0.1, updated=1_700_000_000.0)
    bucket, wait = take(bucket, 1_700_000_000.2)
    assert wait > 0
    _, early = take(bucket, 1_700_000_000.2 + wait / 2)
    assert early > 0
    _, on_time = take(bucket, 1_700_000_000.2 + wait)
    assert on_time == 0.0


def test_a_clock_going_back_mints_no_tokens() -> None:
    """If the clock steps back, the time in between is not paid for twice."""
    bucket, _ = take_all(TokenBucket.full(rate=1.0, burst=1, now=10.0), [10.0])
    back, wait = take(bucket, 5.0)
    assert back == bucket  # nothing refilled, ``updated`` stays at 10
    assert wait == pytest.approx(6.0)  # back to 10, then one second for a token
    _, admitted = take_all(back, [6.0, 9.0, 10.0, 10.9, 11.0, 11.0])
    assert admitted == [11.0]


def test_a_clock_going_back_still_spends_tokens_already_there() -> None:
    """Tokens already in the bucket are usable whatever the clock says."""
    bucket = TokenBucket.full(rate=1.0, burst=2, now=10.0)
    bucket, wait = take(bucket, 3.0)
    assert wait == 0.0
    assert bucket.tokens == 1.0 and bucket.updated == 10.0


def test_coming_back_a_hair_early_every_time_gains_nothing() -> None:
    """The microsecond of leeway is lent, not given: a caller always slightly early still gets only the rate."""
    rate = 1000.0
    bucket = TokenBucket.full(rate=rate, burst=1, now=0.0)
    now, admitted = 0.0, 0
    for _ in range(20_000):
        bucket, wait = take(bucket, now)
        if wait == 0.0:
            admitted += 1
        else:
            now += max(0.0, wait - 0.9e-6)
    assert admitted <= 1 + rate * now + slack(rate)


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1), (-1.0, 1), (1.0, 0.5), (1.0, 0)])
def test_a_bucket_that_could_never_admit_is_refused(rate: float, burst: float) -> None:
    """A zero rate or a burst below one token is a configuration bug, caught when the bucket is made."""
    with pytest.raises(ValueError):
        TokenBucket.full(rate=rate, burst=burst, now=0.0)


rates = st.floats(0.01, 1000.0)
bursts = st.one_of(st.integers(1, 20).map(float), st.floats(1.0, 20.0))


@settings(max_examples=300)
@given(
    rate=rates,
    burst=bursts,
    start=st.one_of(st.floats(0.0, 1e4), st.floats(1.6e9, 1.8e9)),
    gaps=st.lists(st.one_of(st.just(0.0), st.floats(0.0, 0.01), st.floats(0.0, 5.0)), max_size=200),
)
def test_admitted_calls_in_any_interval_are_bounded(rate: float, burst: float, start: float, gaps: list[float]) -> None:
    """However a caller hammers it, at most burst + rate*(t1-t0) calls get through in any [t0, t1]."""
    times = list(itertools.accumulate(gaps, initial=start))
    _, admitted = take_all(TokenBucket.full(rate, burst, start), times)
    for i, t0 in enumerate(admitted):
        for j in range(i, len(admitted)):
            t1 = admitted[j]
            assert j - i + 1 <= burst + rate * (t1 - t0) + slack(rate)


@settings(max_examples=300)
@given(rate=rates, burst=bursts, times=st.lists(st.floats(0.0, 100.0), max_size=200))
def test_a_clock_jumping_around_admits_no_extra_calls(rate: float, burst: float, times: list[float]) -> None:
    """With times in any order, no more calls get through than the latest time seen has paid for."""
    _, admitted = take_all(TokenBucket.full(rate, burst, 0.0), times)
    latest = max(times, default=0.0)
    assert len(admitted) <= burst + rate * latest + slack(rate)


@settings(max_examples=500)
@given(
    rate=rates,
    burst=bursts,
    tokens=st.floats(-0.001, 20.0),
    updated=st.one_of(st.floats(0.0, 1e4), st.floats(1.6e9, 1.8e9)),
    offset=st.floats(-100.0, 100.0),
)
def test_the_wait_returned_is_exact_enough(
    rate: float, burst: float, tokens: float, updated: float, offset: float
) -> None:
    """A denied caller that comes back after exactly the wait it was told is admitted, even at epoch timestamps."""
    assume(tokens <= burst)
    now = updated + offset
    bucket, wait = take(TokenBucket(rate, burst, tokens, updated), now)
    assert wait >= 0.0
    if wait > 0.0:
        assert bucket.tokens < 1.0
        _, again = take(bucket, now + wait)
        assert again == 0.0


@settings(max_examples=300)
@given(rate=rates, burst=bursts, start=st.floats(0.0, 1e4), n=st.integers(1, 100))
def test_a_caller_that_waits_as_told_gets_exactly_the_rate(rate: float, burst: float, start: float, n: int) -> None:
    """Pacing by the returned wait sustains the configured rate: the bucket neither starves nor overshoots it."""
    bucket = TokenBucket.full(rate, burst, start)
    now, sent = start, 0
    for _ in range(2 * (n + int(burst))):
        bucket, wait = take(bucket, now)
        sent += wait == 0.0
        if sent == n + int(burst):
            break
        now += wait
    # The burst goes out at once; every further call costs 1/rate seconds.
    assert sent == n + int(burst)
    assert now - start == pytest.approx((sent - burst) / rate, rel=1e-6, abs=1e-6)


@settings(max_examples=300)
@given(rate=rates, burst=bursts, times=st.lists(st.floats(-50.0, 100.0), max_size=100))
def test_tokens_stay_between_a_borrowed_crumb_and_burst(rate: float, burst: float, times: list[float]) -> None:
    """The bucket never holds more than burst, and never owes more than the crumb it lends an on-time caller."""
    bucket = TokenBucket.full(rate, burst, 0.0)
    for now in times:
        bucket, _ = take(bucket, now)
        assert -slack(rate) <= bucket.tokens <= burst


def test_rebucket_starts_full_keeps_an_unchanged_bucket_and_caps_tokens_on_a_new_share() -> None:
    """A first bucket is full; the same share keeps the bucket; a new share (live workers changed) keeps the tokens,
    capped at the new burst, without refilling."""
    first = rebucket(None, 4.0, 10.0)
    assert first == TokenBucket(rate=4.0, burst=4.0, tokens=4.0, updated=10.0)
    assert rebucket(first, 4.0, 20.0) is first
    assert rebucket(first, 2.0, 20.0) == TokenBucket(rate=2.0, burst=2.0, tokens=2.0, updated=10.0)
    low = TokenBucket(rate=4.0, burst=4.0, tokens=0.5, updated=10.0)
    assert rebucket(low, 8.0, 20.0) == TokenBucket(rate=8.0, burst=8.0, tokens=0.5, updated=10.0)
    assert rebucket(None, 0.1, 0.0).burst == 1.0, "a share below one call per second still holds one whole token"


# --- share ---------------------------------------------------------------------------


def test_share_splits_a_cluster_limit_evenly() -> None:
    """Each live worker gets an equal part, so together they keep to the cluster-wide limit."""
    assert share(10, 4) == 2.5
    assert share(100.0, 1) == 100.0


@pytest.mark.parametrize("live", [0, -3])
def test_share_with_no_live_workers_counts_this_one(live: int) -> None:
    """Before the worker sees itself in the membership it still gets the whole limit, not a division by zero."""
    assert share(10, live) == 10.0


def test_share_never_drops_below_minimum() -> None:
    """With more workers than the limit, each still gets ``minimum``,
    so none starves (the total may exceed the limit)."""
    assert share(3, 10) == 1.0
    assert share(3, 10, minimum=0.5) == 0.5
    assert share(3, 10, minimum=0) == pytest.approx(0.3)


@given(limit=st.floats(1.0, 1e6), live=st.integers(1, 1000))
def test_share_adds_up_to_at_least_the_limit(limit: float, live: int) -> None:
    """Splitting never loses capacity: the workers' shares together cover the limit."""
    assert share(limit, live) * live >= limit * (1 - 1e-12)
    assert share(limit, live) <= limit


# --- ramp ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "expected"),
    [(100.0, 1.0), (102.5, 3.25), (105.0, 5.5), (110.0, 10.0), (1000.0, 10.0)],
)
def test_ramp_grows_linearly_from_one_to_the_limit(now: float, expected: float) -> None:
    """After a breaker closes, the provider gets one call at first and the full limit after ramp_s."""
    assert ramp(10, closed_at=100.0, now=now, ramp_s=10.0) == pytest.approx(expected)


def test_ramp_without_a_close_or_a_duration_is_the_limit() -> None:
    """A provider that never tripped, or with slow start off, gets its full limit."""
    assert ramp(10, closed_at=None, now=0.0, ramp_s=10.0) == 10
    assert ramp(10, closed_at=100.0, now=100.0, ramp_s=0.0) == 10


def test_ramp_before_closed_at_starts_slow() -> None:
    """A worker whose clock is behind the one that closed the breaker takes the cautious end of the ramp."""
    assert ramp(10, closed_at=100.0, now=90.0, ramp_s=10.0) == 1.0


@pytest.mark.parametrize("closed_at", [None, 100.0])
def test_ramp_never_goes_below_one(closed_at: float | None) -> None:
    """Even a limit below one lets a single call through, so a closed breaker is never stuck at zero."""
    assert ramp(0.5, closed_at=closed_at, now=101.0, ramp_s=10.0) == 1.0


@given(
    limit=st.floats(0.0, 1000.0),
    closed_at=st.floats(0.0, 100.0),
    ramp_s=st.floats(0.0, 100.0),
    t0=st.floats(-50.0, 300.0),
    t1=st.floats(-50.0, 300.0),
)
def test_ramp_only_grows_and_stays_between_one_and_the_limit(
    limit: float, closed_at: float, ramp_s: float, t0: float, t1: float
) -> None:
    """The allowed concurrency never shrinks as time passes after a close, and stays within [1, limit]."""
    t0, t1 = sorted((t0, t1))
    a, b = ramp(limit, closed_at, t0, ramp_s), ramp(limit, closed_at, t1, ramp_s)
    assert 1.0 <= a <= b <= max(1.0, limit)
