"""Exponential backoff with full jitter: a pure function, its randomness passed in."""

from __future__ import annotations

import random


def backoff(
    attempt: int,
    *,
    base: float = 0.5,
    cap: float = 30.0,
    jitter: bool = True,
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before retry number ``attempt`` (1 = the first retry).

    The ceiling doubles each attempt up to ``cap``; with jitter the delay is drawn
    uniformly from [ceiling/2, ceiling] so retries of many tasks spread out but
    still grow. A provider's ``Retry-After`` is a floor: we never come back sooner
    than it asked, even past ``cap``.
    """
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    ceiling = min(cap, base * 2.0 ** min(attempt - 1, 62))
    delay = ceiling
    if jitter:
        delay = (rng or random).uniform(ceiling / 2.0, ceiling)
    if retry_after is not None and retry_after > delay:
        delay = retry_after
    return delay
