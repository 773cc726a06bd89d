"""The breakers' own probes: once a breaker's open timeout elapsed, one cheap call, cluster-wide, decides it.

Without them a breaker half-opens only when a task asks, and every other task of a burst falls down the ladder
before that probe's verdict. The log admits at most ``half_open_probes`` probes cluster-wide, so every worker may
try: one gets the place, the others' tasks wait for its verdict (``Circuits.acquire``).
"""

from __future__ import annotations

import asyncio
import functools
import logging

from agents_stream.background import Background
from agents_stream.contract.errors import CircuitOpen, RateLimited, classify
from agents_stream.providers.base import Provider
from agents_stream.resilience.circuits import Circuits

__all__ = ["Prober", "probe_once"]

log = logging.getLogger(__name__)

#: how often the prober looks for a breaker whose open timeout elapsed
INTERVAL_S = 0.25


async def probe_once(circuits: Circuits, provider: Provider) -> str | None:
    """Probe ``provider`` if its breaker is half-open with no probe out; what the probe came to, or None when the
    log gave the place to another worker (or there was nothing to probe)."""
    try:
        permit = await circuits.acquire_probe(provider.name)
    except CircuitOpen:
        return None
    result, retry_after = "failure", None
    try:
        async with asyncio.timeout(provider.config.timeout_s + 5.0):
            await provider.ping()
        result = "success"
    except asyncio.CancelledError:
        result = "neutral"  # nothing learnt: the place is given back
        raise
    except RateLimited as exc:
        result, retry_after = "rate_limited", exc.retry_after  # up, only busy: the circuits count it a success
    except Exception as exc:
        # A 400 is an answer (the provider is up); timeouts, 5xx, 401/403 and broken bodies are failures.
        result = "success" if classify(exc) == "permanent" else "failure"
        log.info("Breaker %s: probe failed (%s); it stays open for another open timeout", provider.name, exc)
    finally:
        circuits.release(permit, result, retry_after=retry_after)
    return result


class Prober:
    """Probes every breaker of this worker whose open timeout elapsed; run by the executor, cancelled at its stop."""

    def __init__(self, circuits: Circuits, providers: dict[str, Provider], interval_s: float = INTERVAL_S) -> None:
        self.circuits = circuits
        self.providers = providers
        self.interval_s = interval_s
        self._probing: dict[str, asyncio.Task[str | None]] = {}  # by provider: one probe at a time
        self._probes = Background("breaker probes")

    async def run(self) -> None:
        """Until cancelled: start a probe for each circuit that is due (one at a time per provider)."""
        try:
            while True:
                for name in self.circuits.probes_due():
                    provider = self.providers.get(name)
                    if provider is not None and name not in self._probing:
                        self._probing[name] = self._probes.start(
                            probe_once(self.circuits, provider), functools.partial(self._done, name),
                        )
                await asyncio.sleep(self.interval_s)
        finally:
            await self._probes.stop()

    def _done(self, name: str, task: asyncio.Task[str | None]) -> None:
        self._probing.pop(name, None)
        if not task.cancelled() and task.exception() is not None:
            log.warning("Breaker %s: the probe broke (%r); the next one is tried in %gs", name, task.exception(),
                        self.interval_s)
