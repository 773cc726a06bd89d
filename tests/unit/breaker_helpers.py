"""Shared helpers of the breaker tests: one config, a fold, and breakers that opened or went half-open."""

from __future__ import annotations

from collections.abc import Iterable

from agents_stream.config import BreakerConfig
from agents_stream.resilience.breaker import (
    HALF_OPEN,
    OPEN,
    Breaker,
    Event,
    Failure,
    ProbeRequest,
    Transition,
    admitted,
    step,
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
