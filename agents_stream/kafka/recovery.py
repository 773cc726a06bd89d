"""Table recovery that stopped receiving changelog records is read again from where it stands.

Faust's recovery seeks each active changelog partition to the offset its local
store holds and waits until every one has reached its end offset. It waits
forever if the records it needs were fetched but never delivered: a fetch
started before the rebalance finishes after the new assignment, drains the
records recovery has just sought to, and Faust drops them because the flow was
stopped (docs/decisions.md, "Recovery that waits forever"). aiokafka's position
is then past them, nothing fetches them again, and the worker never gets ready
(seen at scale-in: a worker that took partitions back waited 90 s and more on
records 13..98 of a tasks changelog partition).

``RecoveryWatch`` looks every second while Faust is in recovery: an active
changelog partition with records left whose applied offset has not moved for
``stall_after_s`` is sought back to the record after it, and so is one that has
not moved for ``FETCHED_PAST_S`` while the consumer's fetch position is past
that record (fetched, never applied: the known drop). A false alarm (a slow
read) costs a re-read of records recovery skips as already applied.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from faust.types import TP
from mode import Service

from agents_stream.kafka import security as kafka_security
from agents_stream.kafka.stall import StallDetector
from agents_stream.settings import Settings, bootstrap_servers
from agents_stream.tables.changelog import ChangelogRecord

log = logging.getLogger(__name__)


#: how long a recovering changelog partition stands still, its fetch position past the record after its applied
#: offset, before that record is read again. Faust applies a record as it arrives, so a position past it means it
#: was fetched and dropped: a scale-out test waited stall_after_s (15 s) on two such records of a tasks changelog.
FETCHED_PAST_S = 2.0


class RecoveryWatch(Service):
    """Owned by the app (one of its services), so it also watches the recovery before the worker's first start."""

    def __init__(self, app: Any, stall_after_s: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.app = app
        self.stall_after_s = stall_after_s
        self.stalls = StallDetector(stall_after_s)
        self.briefly = StallDetector(min(stall_after_s, FETCHED_PAST_S))

    @Service.task
    async def _watch(self) -> None:
        if self.stall_after_s <= 0:
            return
        interval = max(0.5, min(1.0, self.stall_after_s / 4))
        while not self.should_stop:
            await self.sleep(interval)
            try:
                await self.check(time.monotonic())
            except Exception as exc:  # a watch that fails looks again on the next tick
                log.warning("Recovery check failed (%r); the next tick tries again", exc)

    def stalled(self, recovery: Any, now: float) -> dict[TP, int]:
        """The active changelog partitions whose recovery stood still for ``stall_after_s``: partition → offset to
        read again from."""
        return _standing(self.stalls, recovery, now)

    def standing(self, recovery: Any, now: float) -> dict[TP, int]:
        """Those that stood still for ``FETCHED_PAST_S``: read again when the fetch position is past (``check``)."""
        return _standing(self.briefly, recovery, now)

    async def check(self, now: float) -> None:
        recovery = self.app.tables.recovery
        consumer = self.app.consumer
        stalled, standing = self.stalled(recovery, now), self.standing(recovery, now)
        for tp, offset in sorted({**standing, **stalled}.items()):
            try:  # past the records recovery waits for: they were fetched and dropped (the known stall)
                position = await asyncio.wait_for(consumer.position(tp), timeout=5.0)
            except Exception:
                position = None
            if not recovery.in_recovery:
                return  # it ended while we asked: the next rebalance's recovery seeks for itself
            if tp not in stalled and (position is None or position <= offset):
                continue  # nothing fetched past it: a slow read, not the known drop; stall_after_s decides
            log.warning(
                "Table recovery of %s:%d has had no record for %.0fs at offset %d (last offset %s, fetch position "
                "%s); reading it again from %d. If this repeats, report it with this log.",
                tp.topic, tp.partition, self.stall_after_s if tp in stalled else self.briefly.after_s, offset - 1,
                recovery.active_highwaters.get(tp), position, offset,
            )
            await asyncio.wait_for(consumer.seek(tp, offset), timeout=10.0)


def _standing(stalls: StallDetector, recovery: Any, now: float) -> dict[TP, int]:
    """The active changelog partitions ``stalls`` finds standing still, with records left: partition → the offset
    after the applied one."""
    if not recovery.in_recovery:
        stalls.clear()  # the next recovery starts its clocks again
        return {}
    found: dict[TP, int] = {}
    for tp, end in list(recovery.active_highwaters.items()):
        at = recovery.active_offsets.get(tp)
        if end is None or at is None:
            continue
        if stalls.observe(tp, at, end, now):
            found[tp] = max(at + 1, 0)
    return found


async def read_changelog(settings: Settings, tp: TP, start: int, end: int) -> list[ChangelogRecord]:
    """The records of changelog partition ``tp`` from ``start`` up to ``end`` (exclusive), read with a consumer of
    its own (no group): not through Faust's, whose fetcher dropped them (tables/changelog.py, ``RecoveryStarts``).
    Fewer, or none, where the changelog has none (compacted, or deleted by retention). The caller bounds the read;
    the client's start and stop have bounds of their own."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers(settings.broker), group_id=None, enable_auto_commit=False,
        **kafka_security.client_kwargs(settings),
    )
    await asyncio.wait_for(consumer.start(), timeout=10.0)
    out: list[ChangelogRecord] = []
    try:
        part = TopicPartition(tp.topic, tp.partition)
        consumer.assign([part])
        consumer.seek(part, start)
        while True:
            batch = await consumer.getmany(part, timeout_ms=1000)
            for r in batch.get(part, []):
                if r.offset >= end:
                    return out
                out.append(ChangelogRecord(tp, r.offset, r.key, r.value, tuple(r.headers or ())))
            if await consumer.position(part) >= end:
                return out
    finally:
        await asyncio.wait_for(consumer.stop(), timeout=10.0)
