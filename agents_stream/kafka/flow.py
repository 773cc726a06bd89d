"""Flow control of the input partitions: pauses by agent, stall re-reads, reading starts and consumer lag."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Hashable, Protocol

from faust.types import TP

from agents_stream.background import Background
from agents_stream.contract import topics
from agents_stream.kafka.stall import StallDetector
from agents_stream.kafka.watermark import Watermark
from agents_stream.ops import metrics

log = logging.getLogger(__name__)

#: how long the steps after a rebalance wait for the group's committed offsets of the newly assigned partitions
SEED_S = 5.0

#: how long after a re-read of a partition from an offset the ledger's report of the same gap is not acted on: the
#: records delivered before the seek (in a stream's buffer) report it meanwhile, and the re-read's own records
#: arrive behind them (``Flow.reread``)
REREAD_AGAIN_S = 5.0

#: (event, details): a control event about this worker (agents_stream.ledger's alerts)
Alert = Callable[[str, dict[str, Any]], None]


class FlowApp(Protocol):
    """What the flow reads of the Faust app (``faust.App`` is one): its consumer, made when the app starts, and
    whether a table recovery runs. Its ``rebalancing`` and ``tables.recovery`` are read where the app has them."""

    @property
    def consumer(self) -> Any: ...

    @property
    def in_recovery(self) -> bool: ...


class Flow:
    """Which input partitions this worker fetches, and reading them again when records never arrived.

    The consumer is the app's WatermarkConsumer (agents_stream.kafka.consumer), read through
    ``app.consumer`` at each call: Faust makes it when the app starts.
    """

    def __init__(
        self,
        app: FlowApp,
        watermark: Watermark,
        managed_topics: frozenset[str],
        agents: list[str],
        *,
        blocked: Callable[[str], bool],
        ready: Callable[[], bool],
        alert: Alert,
        stall_after_s: float,
    ) -> None:
        self.app = app
        self.watermark = watermark
        self.managed_topics = managed_topics
        self.agents = agents
        self.blocked = blocked  # an agent whose provider is down or whose queue is full
        self.ready = ready  # the worker started (between rebalances, only then are stalls looked for)
        self.alert = alert
        self.stall_after_s = stall_after_s
        self.paused: set[TP] = set()
        #: a rebalance of this worker has begun (partitions revoked or assigned) and Faust has not yet resumed its
        #: streams after it (``resumed``): Faust pauses the input partitions until their tables are recovered
        self.awaiting_resume = False
        self.stalls = StallDetector(stall_after_s)
        self._rereads: dict[TP, tuple[int, float]] = {}  # partition → (offset sought back to, when)
        self._looked = 0.0  # when check_progress last asked the broker for end offsets (monotonic)
        self._seeks = Background("seeks back to a stalled partition's first unhandled record")

    @property
    def consumer(self) -> Any:
        return self.app.consumer

    def _assignment(self) -> set[TP] | None:
        try:
            return set(self.consumer.assignment())
        except Exception:  # not started yet
            return None

    def update(self) -> None:
        """Pause intake of agents whose provider is down or whose queue is full; resume the others."""
        assigned = self._assignment()
        if assigned is None:
            return
        want: set[TP] = set()
        for agent in self.agents:
            if self.blocked(agent):
                name = topics.task_topic(agent)
                want.update(tp for tp in assigned if tp.topic == name)
        pause, resume = want - self.paused, (self.paused & assigned) - want
        self.consumer.held = frozenset(want)  # Faust's resume at the end of a recovery leaves these paused
        if pause:
            self.consumer.pause_partitions(pause)
            log.info("Intake paused on %d partitions (provider down or queue full)", len(pause))
        if resume and not self._rebalancing():
            self.consumer.resume_partitions(resume)
            log.info("Intake resumed on %d partitions", len(resume))
        # During a rebalance Faust holds every assigned partition until its table partitions are recovered, and
        # resumes the ones not ``held`` itself when that ends. Resuming one earlier let the ledger act on a task
        # message its table partition did not have the record of yet: in the chaos run a breaker half-opening
        # mid-recovery resumed a partition, and three tasks another worker had finished ran again.
        self.paused = want

    def consumer_lag(self) -> dict[str, int]:
        """Records not yet done per input topic on this worker's partitions, from memory only (for /metrics):
        the consumer's last fetched end offset minus the commit watermark (Faust's last commit before the
        ledger handled anything). A paused partition's end offset is the one from before the pause."""
        consumer = self.consumer
        ends: dict[TP, int | None] = {}
        positions: dict[TP, int | None] = {}
        for tp in self._assignment() or set():
            if tp.topic not in self.managed_topics:
                continue
            try:
                ends[tp] = consumer.highwater(tp)
            except Exception:  # revoked since assignment() was read
                continue
            at = self.watermark.commit_offset(tp)
            positions[tp] = at if at is not None else consumer.committed_offset(tp)
        return metrics.consumer_lag(ends, positions, self.managed_topics)

    def _rebalancing(self) -> bool:
        """From a revoke or an assignment until Faust resumes the streams after its recovery. ``app.rebalancing``
        alone is not enough: a recovery of the generation before that ends during the next rebalance clears it
        (Faust's "Worker ready"), and ``in_recovery`` is set only once the next recovery reads the changelogs. In
        between, resuming the partitions Faust paused let the ledger apply task messages to a table partition
        still being rebuilt from its changelog: a finished task, missing there, ran again and was answered twice
        (docs/cluster.md)."""
        return bool(self.awaiting_resume or self.app.in_recovery or getattr(self.app, "rebalancing", False))

    def superseded(self) -> bool:
        """A later assignment already asked for another recovery: Faust's ``on_rebalance_complete`` of the
        current one is stale (Faust sends it, then skips its resume)."""
        recovery = getattr(getattr(self.app, "tables", None), "recovery", None)
        pending = getattr(recovery, "signal_recovery_start", None)
        return pending is not None and pending.is_set()

    def resumed(self) -> None:
        """Faust's recovery ended and it resumes the streams (``on_rebalance_complete``), unless it was
        ``superseded``."""
        if self.superseded():
            return
        self.awaiting_resume = False
        assigned = self._assignment() or set()
        positions: dict[Hashable, int | None] = {
            tp: self.watermark.next_offset(tp) for tp in assigned if tp.topic in self.managed_topics
        }
        self.stalls.restart_at(positions, time.monotonic())

    def watched(self) -> set[TP]:
        """Between rebalances: the assigned input partitions that should be fetched (not paused by us, not held
        back by a full stream buffer). Empty during a rebalance or table recovery, which pause on purpose."""
        if self._rebalancing() or not self.ready():
            return set()
        assigned = self._assignment()
        if assigned is None:
            return set()
        buffered = self.consumer.buffered_partitions()
        return {
            tp for tp in assigned if tp.topic in self.managed_topics and tp not in self.paused and tp not in buffered
        }

    async def reading_starts(self, tps: set[TP]) -> dict[TP, int | None]:
        """Where reading starts on ``tps``: the group's commit, or the earliest offset without one
        (auto_offset_reset)."""
        consumer = self.consumer
        starts = await asyncio.wait_for(consumer.committed_offsets(tps), timeout=10.0)
        unset = {tp for tp, at in starts.items() if at is None}
        if unset:
            starts.update(await asyncio.wait_for(consumer.earliest_offsets(*unset), timeout=10.0))
        return starts

    def check(self) -> None:
        """Every assigned input partition we did not pause must be fetched: resume one Faust left paused.

        After a rebalance in which a worker regained partitions it had owned before, some of them stayed out
        of Faust's active set (docs/decisions.md). Faust pauses every partition during a rebalance and
        recovery on purpose, so this looks only between them.
        """
        watched = self.watched()
        stuck = watched - self.consumer.active_partitions() if watched else set()
        if stuck:
            log.warning(
                "Partitions %s were assigned but not being fetched (left paused across a rebalance); resuming them",
                sorted(f"{tp.topic}:{tp.partition}" for tp in stuck),
            )
            self.consumer.resume_partitions(stuck)
            self.alert("alert.partitions_resumed", {"partitions": sorted(f"{tp.topic}:{tp.partition}" for tp in stuck)})

    def reread(self, tp: TP, offset: int, *, stalled: bool = False) -> bool:
        """Records of ``tp`` from ``offset`` never reached the ledger: seek back there. True when a seek was started
        (the caller logs it and alerts).

        The ledger asks once per record past the gap, so the same offset is sought again only ``REREAD_AGAIN_S``
        after the last seek (the records delivered before the seek report the same gap meanwhile). The progress
        check (``stalled``) is not held to that: the partition stood still since, so that seek delivered nothing.
        Nothing is sought, and nothing counts as sought, while the rebalance's own seek to the group's commits is
        still to come (it never passes the gap)."""
        if self._commit_seek_to_come() or tp not in self.consumer.assignment():
            return False
        now = time.monotonic()
        last = self._rereads.get(tp)
        if not stalled and last is not None and last[0] == offset and now - last[1] < REREAD_AGAIN_S:
            return False
        self._rereads[tp] = (offset, now)
        self._seeks.start(self._seek(tp, offset))
        return True

    def _commit_seek_to_come(self) -> bool:
        """A rebalance of this worker has begun and Faust has not yet sought its partitions to the group's commits.

        Not ``_rebalancing``: Faust seeks them after its recovery ends (``resumed``) and clears ``app.rebalancing``
        only later ("Worker ready"). Records it drops in between are a gap no rebalance seek will fill: in a B4 run
        one was skipped there, and its outcomes waited 19 s for the progress check's full period."""
        return bool(self.awaiting_resume or self.app.in_recovery)

    async def _seek(self, tp: TP, offset: int) -> None:
        consumer = self.consumer
        if self._commit_seek_to_come() or tp not in consumer.assignment():
            if self._rereads.get(tp, (None,))[0] == offset:
                del self._rereads[tp]  # not sought: the next report of the gap asks again
            return  # a rebalance began meanwhile: it seeks to the commits, which never pass the gap
        if (self.watermark.next_offset(tp) or 0) > offset:
            return  # the records of the gap arrived meanwhile (fetched before the seek was asked for)
        try:
            earliest = (await asyncio.wait_for(consumer.earliest_offsets(tp), timeout=10.0)).get(tp)
            if earliest is not None and offset < earliest:
                log.warning(
                    "Offsets %d..%d of %s:%d were deleted by retention before they were read; going on from %d",
                    offset, earliest - 1, tp.topic, tp.partition, earliest,
                )
                self.watermark.skip_to(tp, earliest)
                return
            await asyncio.wait_for(consumer.read_again(tp, offset), timeout=10.0)
        except Exception as exc:  # the progress check seeks again if this one did not happen
            log.warning(
                "Could not seek %s:%d back to %d (%r); the progress check retries", tp.topic, tp.partition, offset, exc,
            )

    async def stop(self) -> None:
        """Cancel the seeks still running (each is bounded; nothing waits for them on the way out)."""
        await self._seeks.stop()

    async def seed_starts(self, assigned: set[TP]) -> None:
        """Tell the watermark where reading starts on each newly assigned input partition (the group's commit),
        so records Faust drops right after the rebalance are a gap, not a new start."""
        fresh = {tp for tp in assigned if tp.topic in self.managed_topics and self.watermark.next_offset(tp) is None}
        if not fresh:
            return
        try:  # the streams wait for this: bounded, as a start not seeded costs only a later check
            starts = await asyncio.wait_for(self.reading_starts(fresh), timeout=SEED_S)
        except Exception as exc:  # without a start the first record read sets it, as before
            log.warning("Could not read the committed offsets of %d assigned partitions (%r); a record dropped right "
                        "after this rebalance is caught by the progress check only", len(fresh), exc)
            return
        for tp, at in starts.items():
            if at is not None:
                self.watermark.start(tp, at)

    async def check_progress(self) -> None:
        """Read again, from the first unhandled offset, an assigned partition whose records stopped arriving.

        Faust's fetcher can pass a record without delivering it: the partition is assigned and active, its
        lag stays, and nothing moves until a restart (docs/decisions.md). Nothing is lost: nothing was
        committed past it.
        """
        watched = self.watched()
        if not watched:
            return
        # every tick (twice a second) while a partition a rebalance just assigned has not moved
        # (StallDetector.fresh); else every quarter of stall_after_s: one end-offset request per look
        now = time.monotonic()
        if not self.stalls.fresh(watched) and now - self._looked < self.stall_after_s / 4:
            return
        self._looked = now
        ends = await asyncio.wait_for(self.consumer.highwaters(*watched), timeout=10.0)
        positions = {tp: self.watermark.next_offset(tp) for tp in watched}
        unknown = {tp for tp, at in positions.items() if at is None and (ends.get(tp) or 0) > 0}
        if unknown:  # the start was not seeded at the assignment (its lookup failed)
            positions.update(await self.reading_starts(unknown))
        now = time.monotonic()
        for tp in sorted(watched):
            end, at = ends.get(tp), positions.get(tp)
            if end is None or at is None or (stall := self.stalls.observe(tp, at, end, now)) is None:
                continue
            last = self._rereads.get(tp)
            if last is not None and last[0] == at and now - last[1] < self.stalls.fresh_after_s:
                # the ledger's re-read of this gap is under way: it gets the wait a rebalance's seek gets
                self.stalls.restart_at({tp: at}, last[1])
                continue
            if not self.reread(tp, at, stalled=True):
                continue  # revoked meanwhile, or a rebalance began: it seeks to the commits itself
            if stall.fresh:  # expected now and then: what Faust fetched during the recovery it dropped
                log.info(
                    "Partition %s:%d delivered none of its %d waiting records in %.1fs since this rebalance; "
                    "reading it again from %d (docs/decisions.md, the progress check)",
                    tp.topic, tp.partition, end - at, stall.still, at,
                )
            else:
                log.warning(
                    "Partition %s:%d has %d unread records but its read position %d has not moved for %.1fs; "
                    "reading it again from %d (nothing was committed past it). If this repeats, report it with "
                    "this log.", tp.topic, tp.partition, end - at, at, stall.still, at,
                )
            self.alert("alert.partition_reread", {"partition": f"{tp.topic}:{tp.partition}", "offset": at, "end": end})

    def revoked(self, revoked: set[TP]) -> None:
        self.awaiting_resume = True
        self.stalls.forget(revoked)
        self.paused -= revoked
        self.consumer.rereads.cancel(revoked)

    def assigned(self) -> None:
        self.awaiting_resume = True  # Faust pauses every assigned partition until its recovery ends (``resumed``)
        # the rebalance seeks every assigned partition to the group's commit: no re-read is under way after it
        self.consumer.rereads.clear()
        # Faust resumes every partition after a rebalance (docs/faust.md): re-apply our pauses.
        self.paused = set()
        self.update()
