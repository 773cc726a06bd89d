"""What Faust owns and calls into the worker's runtime: the one ledger agent, the timers (lease and take-over
scans, the console's samples, the expiry sweep, the progress check) and the rebalance signals."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Awaitable

from agents_stream.faust_app import AgentsStreamApp
from agents_stream.kafka.takeover import TAKEOVER_SCAN_S
from agents_stream.settings import Settings

if TYPE_CHECKING:
    from agents_stream.app import Runtime

__all__ = ["wire"]

log = logging.getLogger(__name__)

#: the steps after a rebalance that take longer than this are logged (the streams wait for them)
SLOW_REBALANCE_S = 2.0


async def _timed(step: Awaitable[None]) -> float:
    """How long ``step`` took, in seconds."""
    began = time.monotonic()
    await step
    return time.monotonic() - began


def wire(app: AgentsStreamApp, runtime: Runtime, settings: Settings) -> None:
    """The ledger agent, the timers and the rebalance signals: Faust owns them and calls into the runtime."""
    channel = app.topic(
        *app.input_topics, partitions=settings.partitions, internal=True, key_serializer="raw", value_serializer="raw",
    )

    async def ledger_agent(stream: Any) -> None:
        # One event at a time: the ledger is the table's only writer (docs/faust.md, "Tables").
        async for event in stream.events():
            message = event.message
            if runtime.takeover.admit(message.topic, message.partition, message.offset):
                runtime.ledger.handle(event)

    app.agent(channel, name="ledger", concurrency=1)(ledger_agent)

    @app.timer(interval=max(0.5, settings.lease_ttl_s / 4))
    async def lease_scanner() -> None:
        try:
            runtime.scan_leases()
            runtime.update_flow()  # a Retry-After or open_timeout that ran out changes no event: look again
            runtime.flow.check()
        except Exception as exc:  # a timer exception would crash the worker (docs/faust.md)
            log.exception("Lease scan failed (%r); the next tick tries again", exc)

    @app.timer(interval=TAKEOVER_SCAN_S)
    async def takeover_scanner() -> None:
        try:
            runtime.takeover.take_over()
        except Exception as exc:  # a timer exception would crash the worker
            log.exception("Take-over scan failed (%r); the next tick tries again", exc)

    @app.timer(interval=settings.console_sample_s)
    async def console_sample() -> None:
        try:
            runtime.sample()
        except Exception as exc:  # a timer exception would crash the worker (docs/faust.md)
            log.warning("Console sample failed (%r); the charts miss this point, the next tick tries again", exc)

    @app.timer(interval=max(0.5, settings.expiry_interval_s))
    async def expiry_sweep() -> None:
        try:
            await runtime.sweep_expired()
        except Exception as exc:  # a timer exception would crash the worker (docs/faust.md)
            log.exception("Expiry sweep failed (%r); the next tick tries again", exc)

    if settings.stall_after_s > 0:
        # Twice a second: a partition Faust skipped right after a rebalance is read again within 1.5 s of it
        # (kafka/stall.py, FRESH_AFTER_S); a tick asks the broker for the end offsets of the watched partitions only
        # while one of them is fresh from a rebalance, else every quarter of stall_after_s (Flow.check_progress).
        @app.timer(interval=max(0.25, min(0.5, settings.stall_after_s / 4)))
        async def progress_check() -> None:
            try:
                await runtime.flow.check_progress()
            except Exception as exc:  # a timer exception would crash the worker (docs/faust.md)
                log.warning("Progress check failed (%r); the next tick tries again", exc)

    # mode's SignalHandlerT (mypy_extensions argument types) admits no def mypy accepts: hence the ignores.
    # An exception in these signals crashes the worker (Faust calls crash()): what reads the broker or a table
    # contains its own failures (seed_starts, after_rebalance); the rest changes memory only.
    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def _revoked(sender: Any, *args: Any, **kwargs: Any) -> None:
        (revoked,) = args  # Faust sends the revoked partitions positionally
        runtime.on_revoked(set(revoked))

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def _assigned(sender: Any, *args: Any, **kwargs: Any) -> None:
        runtime.on_assigned()

    @app.on_rebalance_complete.connect  # type: ignore[arg-type]
    async def _rebalanced(sender: Any, *args: Any, **kwargs: Any) -> None:
        if runtime.flow.superseded():
            return  # Faust signals a recovery a newer assignment replaced too: the newer one signals its own end
        # After the rebalance completed and before the streams resume (Faust's recovery sends this first): the broker
        # answers offset requests now, and nothing of the new assignment has been read yet. In this order: the
        # ledger applies a partition's records only once it is claimed (Takeover.admit), and the reading starts
        # must be seeded before the first record is applied, or a record Faust dropped before it is a new start
        # instead of a gap. The streams wait for both: a slow one is logged.
        began = time.monotonic()
        seeded = await _timed(runtime.flow.seed_starts(set(app.consumer.assignment())))
        claimed = await _timed(runtime.takeover.claim_epochs())
        if seeded + claimed > SLOW_REBALANCE_S:
            log.warning(
                "The steps after this rebalance took %.1fs (reading the group's committed offsets %.1fs, claiming "
                "the owner epochs %.1fs): the streams resume that much later. If this repeats, check the brokers' "
                "load and the network to them", time.monotonic() - began, seeded, claimed,
            )
        runtime.ledger.scanner.after_rebalance()  # the tables are recovered: parked tasks join the due-time index
        runtime.after_rebalance()
        runtime.flow.resumed()  # Faust resumes the streams next: the flow's checks may look again

    @app.task
    async def _start_runtime() -> None:
        # After table recovery (Faust starts app tasks then): the runtime is the app's child from here on.
        await app.add_runtime_dependency(runtime)
