"""What a worker's local store of a table holds against its changelog: the owner epoch it writes a partition with
(and the former owners' records it skips when it applies the changelog), which changelog offset its store may
resume from (only one whose every local write the broker confirmed), and the partitions whose store must be
rebuilt from the changelog (docs/security.md, "Fencing"; docs/decisions.md, "Only confirmed writes survive a
restart"). A mixin of ``LedgerTable`` (tables/definitions.py), which it shares its store and writes with."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, cast

import orjson
from agents_stream.tables.epochs import EpochFilter, epoch_in, epoch_key, next_epoch
from agents_stream.tables.writes import Unconfirmed, key_bytes, writing
from faust.types import TP
from rocksdict import WriteBatch

__all__ = ["ChangelogRecord", "ChangelogState", "RecoveryStarts"]

log = logging.getLogger(__name__)

#: how long the records of a gap, read again directly from the brokers, may take (``ChangelogState.fill_gap``)
GAP_READ_S = 30.0


@dataclass(frozen=True)
class ChangelogRecord:
    """A changelog record read directly from the brokers (``read_changelog``), shaped as the message of the Faust
    event ``apply_changelog_batch`` applies."""

    tp: TP
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Any = ()

    @property
    def partition(self) -> int:
        return self.tp.partition


@dataclass(frozen=True)
class _Read:
    """``ChangelogRecord`` as the Faust event ``apply_changelog_batch`` takes (its ``message``)."""

    message: ChangelogRecord


class RecoveryStarts:
    """Per table partition, the changelog offset its reading (a recovery, a standby) starts at, until the first
    record arrives: a first record past it means the records before it never reached the table (pure).

    Faust's fetcher drops records fetched right after the recovery's seek (docs/decisions.md, "Recovery that waits
    forever"). When nothing follows, the recovery watch sees the partition stand still; when later records follow
    (another owner's writes), Faust counts the partition recovered past records it never applied. Only the first
    record is checked: a compacted changelog has gaps of its own further on, and checking them all would read the
    brokers again at each.
    """

    def __init__(self) -> None:
        self._start: dict[int, int] = {}

    def start(self, partition: int, offset: int) -> None:
        self._start[partition] = offset

    def first(self, partition: int, offset: int) -> int | None:
        """A record at ``offset`` arrived: the first offset never applied when it is the first record since the
        start and lies past it, else None."""
        start = self._start.pop(partition, None)
        return start if start is not None and offset > start else None


class ChangelogState:
    """Owner epochs, confirmed offsets and stale partitions of one table on this worker (see the module)."""

    # Faust's Table gives these (LedgerTable is a faust.Table)
    app: Any
    data: Any
    name: str
    last_changelog: Any

    def init_changelog_state(self) -> None:
        self.epochs: dict[int, int] = {}  # partition → the epoch this worker writes it with (``claim_epoch``)
        self.epoch_filter = EpochFilter()
        self.skipped = 0  # changelog records skipped as a former owner's (for tests and logs)
        #: partitions whose local store may hold writes the changelog does not (as current): rebuilt from the
        #: changelog the next time this worker owns them (``revoked``, ``changelog_confirmed``)
        self.stale: set[int] = set()
        #: whether the group cannot have expelled this worker yet (Runtime sets it: no commit refused for a
        #: session timeout); a write confirmed otherwise makes its partition ``stale``
        self.trusted: Callable[[], bool] = lambda: True
        self.unconfirmed = Unconfirmed()
        self._opened: set[int] = set()  # partitions whose store this worker checked (``persisted_offset``)
        self.starts = RecoveryStarts()
        #: reads a changelog partition's records in [start, end) directly from the brokers (the app sets it:
        #: kafka/recovery.py); None: a gap is logged and the partition rebuilt the next time it is assigned
        self.read_changelog: Callable[[TP, int, int], Awaitable[list[ChangelogRecord]]] | None = None

    if TYPE_CHECKING:  # LedgerTable's, and faust.Table's
        def get(self, key: str, default: Any = None) -> Any: ...

        def __setitem__(self, key: str, value: Any) -> None: ...

    def claim_epoch(self, partition: int) -> tuple[int, Any]:
        """This worker now owns ``partition``: write it a higher epoch than any it holds or read, and write every
        record of it with that epoch from now on. Returns the epoch and the send of its record (the caller waits
        for it before anything else is written there)."""
        with writing(partition):
            stored = self.get(epoch_key(partition))
        epoch = max(next_epoch(stored), self.epoch_filter.highest.get(partition, 0) + 1)
        self.epochs[partition] = epoch
        self.epoch_filter.start(partition, epoch)
        with writing(partition):
            self[epoch_key(partition)] = {"epoch": epoch}
        return epoch, self.last_changelog

    async def on_changelog_event(self, event: Any) -> None:
        """Faust's hook for each changelog record its recovery or a standby reads, after it put the record in its
        buffer and before it applies the buffer: the first record past the reading's start fills the gap first."""
        await cast(Any, super()).on_changelog_event(event)  # faust.Table's, LedgerTable's next base
        msg = event.message
        gap = self.starts.first(msg.partition, msg.offset)
        if gap is not None:
            await self.fill_gap(event, gap)

    async def fill_gap(self, event: Any, first: int) -> None:
        """Offsets ``first`` up to ``event``'s never reached the table: apply what Faust buffered before ``event``,
        then those records read directly from the brokers, so that ``event`` and the rest are applied after them,
        in order. None found there: the changelog had none (compacted or deleted), nothing was missing."""
        msg = event.message
        tp = msg.tp
        buffer = self._recovery_buffer()
        if buffer and buffer[-1] is event:
            self.apply_changelog_batch(buffer[:-1])
            del buffer[:-1]
        elif buffer:
            self.apply_changelog_batch(list(buffer))
            buffer.clear()
        if self.read_changelog is None:
            self._gap_unfilled(tp, first, msg.offset, "no reader of the changelog is set")
            return
        try:
            records = await asyncio.wait_for(self.read_changelog(tp, first, msg.offset), timeout=GAP_READ_S)
        except Exception as exc:  # Faust's recovery loop logs and goes on: the partition must not be trusted
            self._gap_unfilled(tp, first, msg.offset, repr(exc))
            return
        if records:
            log.warning(
                "Table %s partition %d: changelog offsets %d..%d never reached the table during its recovery (dropped "
                "by the consumer after its seek); %d records read again directly and applied before offset %d. "
                "Nothing to do", self.name, tp.partition, first, msg.offset - 1, len(records), msg.offset,
            )
            self.apply_changelog_batch([_Read(r) for r in records])

    def _gap_unfilled(self, tp: TP, first: int, offset: int, why: str) -> None:
        self.stale.add(tp.partition)
        log.error(
            "Table %s partition %d: changelog offsets %d..%d may never have reached the table during its recovery and "
            "could not be read again (%s): tasks of that partition may run again. The partition is rebuilt from the "
            "changelog the next time this worker is assigned it; restart the worker to rebuild it now",
            self.name, tp.partition, first, offset - 1, why,
        )

    def _recovery_buffer(self) -> list[Any]:
        """Faust's recovery buffer of this table: the records read and not yet applied (Faust 0.15.3)."""
        recovery = getattr(getattr(self.app, "tables", None), "recovery", None)
        buffers = getattr(recovery, "buffers", None)
        return cast("list[Any]", buffers[self]) if buffers is not None and self in buffers else []

    def apply_changelog_batch(self, batch: Any) -> None:
        """Faust's RocksDB apply (recovery, standbys), less the records of a former owner (``EpochFilter``). A
        partition with writes of this worker still unconfirmed (assigned back to it meanwhile) must not look
        confirmed, so its persisted offset goes again."""
        store: Any = self.data
        batches: dict[int, WriteBatch] = {}
        offsets: dict[Any, int] = {}
        skipped = 0
        for event in batch:
            msg = event.message
            offsets[msg.tp] = max(msg.offset, offsets.get(msg.tp, msg.offset))
            partition = msg.partition
            if not self.epoch_filter.known(partition):
                self.epoch_filter.start(partition, self._stored_epoch(partition))
            if not self.epoch_filter.keep(partition, epoch_in(msg.headers)):
                skipped += 1
                continue
            write = batches.get(partition)
            if write is None:
                write = batches[partition] = WriteBatch(raw_mode=True)
            if msg.value is None:
                write.delete(msg.key)
            else:
                write.put(msg.key, msg.value)
        for partition, write in batches.items():
            store._db_for_partition(partition).write(write)
        for tp, offset in offsets.items():
            store.set_persisted_offset(tp, offset)
        for partition in {tp.partition for tp in offsets} & set(self.unconfirmed.partitions()):
            store._db_for_partition(partition).delete(store.offset_key)
        if skipped:
            self.skipped += skipped
            log.warning(
                "Table %s: %d changelog records written by a former owner after the partition moved were skipped "
                "(fenced: a worker cut off or paused while its writes waited); nothing to do", self.name, skipped,
            )

    def _stored_epoch(self, partition: int) -> int:
        raw = self.data._db_for_partition(partition).get(key_bytes(epoch_key(partition)))
        if raw is None:
            return 0
        try:
            return next_epoch(orjson.loads(raw)) - 1
        except ValueError:
            return 0

    def _on_changelog_sent(self, fut: Any) -> None:  # Faust's callback of a changelog send
        self.changelog_confirmed(fut)

    def changelog_confirmed(self, fut: Any) -> None:
        """The broker confirmed a changelog record: the partition's persisted offset is written once every local
        write of it is confirmed (Faust's own callback writes it at each confirmation)."""
        if self.app.in_transaction:
            super()._on_changelog_sent(fut)  # type: ignore[misc]  # faust.Table's, LedgerTable's next base
            return
        self.record_confirmed(fut.result(), fut.message.key, fut.message.value)

    def record_confirmed(self, res: Any, key: bytes, value: bytes | None) -> None:
        """The broker confirmed the changelog record ``key`` → ``value`` (``res``: its RecordMetadata)."""
        tp = res.topic_partition
        if tp.partition in self.stale:
            return
        if not self.trusted():
            # Confirmed while the group may have expelled this worker: the record may have landed after another
            # owner's, so this store no longer matches the changelog (its records may even be skipped there).
            self.stale.add(tp.partition)
            log.warning("Table %s partition %d: a write was confirmed while this worker may have been out of the "
                        "group; its local store is recovered from the changelog the next time it owns the partition",
                        self.name, tp.partition)
            return
        offset = self.unconfirmed.confirmed(tp.partition, key, value, res.offset)
        if offset is not None:
            self.data.set_persisted_offset(tp, offset)

    def revoked(self, partitions: set[int]) -> None:
        """Partitions taken from this worker: one with writes still unconfirmed may see them land after the next
        owner's; its local store is recovered from the changelog the next time it is this worker's."""
        self.stale |= partitions & set(self.unconfirmed.partitions())

    def persisted_offset(self, tp: TP) -> int:
        """The partition's persisted changelog offset, where Faust's recovery reads on from. The first time this
        worker opens a partition's store, one with data and no persisted offset holds writes the changelog never
        confirmed: it is emptied, so the partition is recovered from the changelog alone."""
        if tp.partition in self.stale:  # see ``revoked`` and ``changelog_confirmed``
            self.stale.discard(tp.partition)
            self._opened.add(tp.partition)
            self.epoch_filter.highest.pop(tp.partition, None)
            self.unconfirmed.forget(tp.partition)
            self._discard(tp.partition, "its writes may have landed after another owner's")
            self.starts.start(tp.partition, 0)
            # -1: Faust's recovery keeps the offset it reached on a partition that stays assigned (active to
            # standby, standby to active) unless it is given another one, and with None it would read the emptied
            # store on from there: every record before it lost (seen in the chaos run: finished tasks ran again).
            return -1
        offset = self.data.persisted_offset(tp)
        if tp.partition not in self._opened:
            self._opened.add(tp.partition)
            if offset is None:
                self._discard(tp.partition)
        # -1 (read from the start), never None: Faust's recovery can seek a partition added while an earlier round
        # of it runs before it builds that partition's offsets, and a None there crashes the worker (aiokafka's
        # seek refuses it; seen once in the chaos run). Faust maps -1 and None to the same start otherwise.
        at = -1 if offset is None else offset
        self.starts.start(tp.partition, at + 1)  # Faust reads the partition on from there (``RecoveryStarts``)
        return at

    def _discard(self, partition: int, why: str = "never confirmed: the worker stopped before the broker answered",
                 ) -> None:
        store: Any = self.data
        db = store._db_for_partition(partition)
        batch, found = WriteBatch(raw_mode=True), 0
        for key in db.keys():
            batch.delete(key)
            found += 1
        if found:
            db.write(batch)
            log.warning(
                "Table %s partition %d: the local store held writes the changelog does not hold as current (%s); its "
                "%d entries are discarded and the partition is recovered from the changelog. Nothing to do",
                self.name, partition, why, found,
            )

