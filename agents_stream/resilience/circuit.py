"""One circuit's state on one worker (``Circuit``), the permit of an admitted call, and what the fold reads."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from agents_stream.config import BreakerConfig, ProviderConfig
from agents_stream.resilience.breaker import Breaker
from agents_stream.resilience.ratelimit import TokenBucket

__all__ = ["Circuit", "LogRecord", "Permit", "circuit_id"]


class LogRecord(Protocol):
    """What the fold reads of one log record (aiokafka's ``ConsumerRecord`` has it)."""

    @property
    def offset(self) -> int: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def timestamp_type(self) -> int: ...


@dataclass(eq=False)
class Permit:
    """One admitted call; give it back with ``Circuits.release``."""

    provider: str
    probe_id: str | None = None
    released: bool = False


@dataclass
class Circuit:
    """One circuit as this worker holds it: the folded breaker, Retry-After, and its own calls and probes."""

    id: str
    config: ProviderConfig
    breaker_config: BreakerConfig
    breaker: Breaker = field(default_factory=Breaker)
    blocked_until: float = 0.0  # Retry-After, from any worker
    in_flight: int = 0  # this worker's calls
    bucket: TokenBucket | None = None
    unfolded: dict[str, float] = field(default_factory=dict)  # own failure/429 event id → sent at
    probing: bool = False  # one local task at a time asks for a probe place
    next_probe_at: float = 0.0  # after a refused request, when to ask again
    #: for the latest Retry-After another worker reported: seconds from its event to this worker's fold
    retry_after_propagation_s: float | None = None
    probe_waiters: dict[str, asyncio.Future[bool]] = field(default_factory=dict)
    #: each sender's latest report of this circuit's successes (a failure or a count), at the log's time: the
    #: floor for the successes its next report counts; entries older than the window are dropped
    reported_at: dict[str, float] = field(default_factory=dict)
    unreported: int = 0  # this worker's closed-state successes not yet on the log
    last_success: float = 0.0  # this worker's clock, of the latest of them


def circuit_id(config: ProviderConfig) -> str:
    """What a breaker protects: one endpoint, model and account (the key's variable name), whatever a config names it.

    Workers of different app ids (or configs) calling the same endpoint share its
    breaker; a second account (another key) is a separate circuit, so it can be a fallback.
    """
    return f"{config.kind}|{config.base_url.rstrip('/') or 'default'}|{config.model}|{config.api_key_env or ''}"
