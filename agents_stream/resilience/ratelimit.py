"""Pure rate and concurrency limits: a token bucket, a worker's share of a cluster limit, slow start."""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["TokenBucket", "ramp", "rebucket", "share", "take"]

#: A take this close (in seconds) before its token is due is admitted. ``now + wait``
#: in floats lands up to half an ulp early (~1e-7s for an epoch timestamp), and a
#: caller who waits exactly as told must not be turned away by rounding. The token
#: is borrowed, not minted: the bucket goes that little below zero.
_EARLY_S = 1e-6


@dataclass(frozen=True)
class TokenBucket:
    """``burst`` tokens at most, refilled at ``rate`` per second; one token per call."""

    #: tokens per second (> 0)
    rate: float
    #: capacity (>= 1)
    burst: float
    #: tokens at ``updated``
    tokens: float
    #: time of ``tokens``
    updated: float

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0, got {self.rate}")
        if not self.burst >= 1:
            raise ValueError(f"burst must be >= 1, got {self.burst}")

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> TokenBucket:
        """A bucket holding ``burst`` tokens at ``now``."""
        return cls(rate=rate, burst=burst, tokens=burst, updated=now)


def take(bucket: TokenBucket, now: float) -> tuple[TokenBucket, float]:
    """Refill to `now`, then take one token: (new bucket, 0.0) when admitted, else (bucket refilled but untouched,
    seconds until a token is available).

    A ``now`` earlier than ``updated`` (the clock went back) refills nothing and
    leaves ``updated`` where it was, so the time between is never paid for twice.
    """
    if now > bucket.updated:
        tokens = min(bucket.burst, bucket.tokens + (now - bucket.updated) * bucket.rate)
        bucket = replace(bucket, tokens=tokens, updated=now)
    # Seconds from `updated` until one whole token is there; <= 0 when it already is.
    short_s = (1.0 - bucket.tokens) / bucket.rate
    if short_s <= _EARLY_S:
        return replace(bucket, tokens=bucket.tokens - 1.0), 0.0
    return bucket, (bucket.updated - now) + short_s


def rebucket(bucket: TokenBucket | None, rate: float, now: float) -> TokenBucket:
    """The bucket for a worker's share ``rate`` (burst ``max(1, rate)``): a full one when there is none yet; when the
    share changed (the number of live workers did), the old bucket at the new rate with its tokens kept (capped)."""
    burst = max(1.0, rate)
    if bucket is None:
        return TokenBucket.full(rate, burst, now)
    if bucket.rate == rate:
        return bucket
    return replace(bucket, rate=rate, burst=burst, tokens=min(bucket.tokens, burst))


def share(limit: int | float, live_workers: int, *, minimum: float = 1) -> float:
    """One worker's part of a cluster-wide limit: limit / max(1, live_workers), at least `minimum`.

    With more workers than the limit allows, each still gets ``minimum`` so none
    starves; the cluster total can then exceed the limit by up to
    ``live_workers * minimum - limit``. No live workers counts as one (this one).
    """
    return max(float(minimum), limit / max(1, live_workers))


def ramp(limit: float, closed_at: float | None, now: float, ramp_s: float) -> float:
    """Slow start after a breaker closes: grows linearly from 1 to `limit` over ramp_s seconds after closed_at;
    `limit` when closed_at is None or ramp_s == 0; never below 1.

    A ``now`` before ``closed_at`` (clocks differ between workers) reads as the
    start of the ramp, the cautious end.
    """
    if closed_at is None or ramp_s <= 0:
        return max(1.0, limit)
    progress = min(1.0, max(0.0, (now - closed_at) / ramp_s))
    return max(1.0, 1.0 + (limit - 1.0) * progress)
