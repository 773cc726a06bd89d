"""The changelog-backed tables of one app: defined once, passed to whoever reads or writes them."""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterator

import faust
import orjson
from agents_stream.tables.epochs import EpochFilter, epoch_in, epoch_key, header, next_epoch
from agents_stream.tables.writes import DELETED, Unconfirmed, WriteBuffer, chain, unanswered
from faust.streams import current_event
from faust.types import TP
from rocksdict import WriteBatch

from agents_stream.settings import Settings

__all__ = ["LedgerTable", "PromptTableManager", "Tables", "define_tables", "writing"]

log = logging.getLogger(__name__)

#: the partition a table write goes to when no Faust event is being handled (``writing``)
_partition: ContextVar[int | None] = ContextVar("agents_stream_table_partition", default=None)
_MISSING = object()


@contextmanager
def writing(partition: int) -> Iterator[None]:
    """Table reads and writes in this block are of ``partition``: for the ledger applying an outcome of its own
    executor between two events, where Faust has no current event to take the partition from."""
    token = _partition.set(partition)
    try:
        yield
    finally:
        _partition.reset(token)


def _value_bytes(value: Any) -> bytes:
    """A value's JSON: orjson's, or the standard module's for what orjson refuses (an integer past 64 bits, which a
    task's context or a model's answer may hold: refusing it would stop the worker on the task's data)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":")).encode()


def _key_bytes(key: str) -> bytes:
    # What Faust's json key serializer makes of a str without orjson (ASCII, escaped): the keys already in every
    # deployed store and changelog. Faust switches to orjson (raw UTF-8) when it is importable, so the keys are
    # encoded here, the same way whatever is installed.
    return json.dumps(key).encode()


class LedgerTable(faust.Table):
    """A Table whose writes are coalesced and flushed once per loop iteration, each with a future to await.

    Faust sends a changelog record per write, fire-and-forget (FAUST-NOTES.md "Tables"), and encodes each value
    twice (store and changelog). Here a write is staged (``tables/writes.py``); reads see it at once; the flush,
    scheduled on the event loop by the first write, encodes each key's last value once, writes one RocksDB batch
    per partition and sends one changelog record per key. ``last_changelog`` is the future of the last write:
    it settles with the broker's answer for the record that carries it, and the ledger holds its offsets until then.

    A write takes its partition from the Faust event being handled, as Faust's own does, or from ``writing``.

    Owner epochs (``tables/epochs.py``): a partition this worker takes over gets a higher epoch (``take``), which
    every changelog record it writes there carries; records of a lower epoch than one already read are skipped
    when the changelog is applied (recovery, standbys).

    Only confirmed writes survive a restart: each batch also deletes the partition's persisted changelog offset,
    which is written back once the broker confirmed every local write of the partition (``Unconfirmed``); a store
    found with data but no persisted offset when this worker first opens it (the last one was killed before the
    broker answered) is discarded, and the partition recovered from the changelog (``persisted_offset``).
    """

    last_changelog: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.staged = WriteBuffer()
        self.broken: BaseException | None = None  # the local store refused a write (see ``flush``)
        self.crashing: asyncio.Future[Any] | None = None  # the worker's crash, once ``broken``
        self.epochs: dict[int, int] = {}  # partition → the epoch this worker writes it with (``take``)
        self.epoch_filter = EpochFilter()
        self.skipped = 0  # changelog records skipped as a former owner's (for tests and logs)
        self.unconfirmed = Unconfirmed()
        self._opened: set[int] = set()  # partitions whose store this worker checked (``persisted_offset``)
        self._unanswered = unanswered(self.name)  # a test fault (tables/writes.py); None in production

    # -- writes --------------------------------------------------------------------------------------

    def __setitem__(self, key: str, value: Any) -> None:
        self._stage(key, value)

    def __delitem__(self, key: str) -> None:
        self._stage(key, DELETED)

    def _stage(self, key: str, value: Any) -> None:
        partition = self._current_partition()
        if partition is None:
            raise TypeError(f"table {self.name}: a write outside the ledger's event handling (key {key!r})")
        if not len(self.staged):
            asyncio.get_running_loop().call_soon(self.flush)
        self.last_changelog = self.staged.stage(partition, key, value)

    def flush(self) -> None:
        """Send what is staged: one changelog record per key (its last value), one RocksDB batch per partition."""
        staged = self.staged.take()
        if not staged:
            return
        try:
            batches: dict[int, WriteBatch] = {}
            records = []
            store: Any = self.data
            for key, write in staged:
                key_bytes = _key_bytes(key)
                value = None if write.value is DELETED else _value_bytes(write.value)
                batch = batches.get(write.partition)
                if batch is None:
                    batch = batches[write.partition] = WriteBatch(raw_mode=True)
                    batch.delete(store.offset_key)  # back once the broker confirmed it all (_on_changelog_sent)
                if value is None:
                    batch.delete(key_bytes)
                else:
                    batch.put(key_bytes, value)
                records.append((write, key_bytes, value))
            for partition, batch in batches.items():
                store._db_for_partition(partition).write(batch)
        except Exception as exc:
            # The local store refused a write: what was staged never reaches the changelog, every send of this
            # table fails from now on (so the offsets that wait for them stay held: an outbox retry would otherwise
            # send the store's older value), and the worker stops so the next owner recovers from the log.
            log.critical(
                "Table %s: writing %d keys to RocksDB failed (%r); the worker stops so its partitions are recovered "
                "from the changelog elsewhere. Check the data dir's disk", self.name, len(staged), exc,
            )
            self.broken = exc
            for _, write in staged:
                if not write.sent.done():
                    write.sent.set_exception(exc)
            self.crashing = asyncio.ensure_future(self.app.crash(exc))  # Faust's crash stops the worker: its owner
            return
        for write, key_bytes, value in records:
            self.unconfirmed.wrote(write.partition, key_bytes, value)
            chain(self._send_raw(write.partition, key_bytes, value), write.sent)

    def send_changelog(
        self, partition: Any, key: Any, value: Any, key_serializer: Any = None, value_serializer: Any = None,
    ) -> Any:
        """One changelog record of ``key`` with ``value`` (None: a tombstone); an outbox retry calls this."""
        raw = None if value is None else _value_bytes(value)
        return self._send_raw(partition, _key_bytes(key), raw)

    def _send_raw(self, partition: int, key: bytes, value: bytes | None) -> Any:
        if self.broken is not None:  # the store refused a write: nothing of this table counts as durable any more
            failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            failed.set_exception(self.broken)
            return failed
        if self._unanswered is not None and value is not None and self._unanswered in value:
            log.warning("Test fault: the changelog record of %s in table %s is never sent", key, self.name)
            return asyncio.get_running_loop().create_future()  # never settles, as if the broker never answered
        epoch = self.epochs.get(partition)
        # Faust's own send (Collection.send_changelog) with the epoch's header: its callback keeps the partition's
        # persisted changelog offset in RocksDB.
        return self.changelog_topic.send_soon(
            key=key, value=value, partition=partition, key_serializer="raw", value_serializer="raw",
            callback=self._on_changelog_sent, eager_partitioning=True,
            headers=[header(epoch)] if epoch is not None else None,
        )

    # -- owner epochs ------------------------------------------------------------------------------

    def take(self, partition: int) -> tuple[int, Any]:
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
        raw = self.data._db_for_partition(partition).get(_key_bytes(epoch_key(partition)))  # type: ignore[attr-defined]
        if raw is None:
            return 0
        try:
            return next_epoch(orjson.loads(raw)) - 1
        except ValueError:
            return 0

    def _on_changelog_sent(self, fut: Any) -> None:
        """The broker confirmed a changelog record: the partition's persisted offset is written once every local
        write of it is confirmed (Faust's own callback writes it at each confirmation)."""
        if self.app.in_transaction:
            super()._on_changelog_sent(fut)
            return
        res, message = fut.result(), fut.message
        tp = res.topic_partition
        offset = self.unconfirmed.confirmed(tp.partition, message.key, message.value, res.offset)
        if offset is not None:
            self.data.set_persisted_offset(tp, offset)

    def persisted_offset(self, tp: TP) -> int | None:
        """The partition's persisted changelog offset, where Faust's recovery reads on from. The first time this
        worker opens a partition's store, one with data and no persisted offset holds writes the changelog never
        confirmed: it is emptied, so the partition is recovered from the changelog alone."""
        offset = self.data.persisted_offset(tp)
        if tp.partition not in self._opened:
            self._opened.add(tp.partition)
            if offset is None:
                self._discard(tp.partition)
        return offset

    def _discard(self, partition: int) -> None:
        store: Any = self.data
        db = store._db_for_partition(partition)
        batch, found = WriteBatch(raw_mode=True), 0
        for key in db.keys():
            batch.delete(key)
            found += 1
        if found:
            db.write(batch)
            log.warning(
                "Table %s partition %d: the local store held writes the changelog never confirmed (the worker "
                "stopped before the broker answered); its %d entries are discarded and the partition is recovered "
                "from the changelog. Nothing to do", self.name, partition, found,
            )

    # -- reads ---------------------------------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        """The key's value: a staged write first, then the store (the current partition's, when one is known)."""
        write = self.staged.lookup(key)
        if write is not None:
            return default if write.value is DELETED else write.value
        raw = self._read(_key_bytes(key))
        return default if raw is None else json.loads(raw)  # exact: orjson reads a huge integer as a float

    def __getitem__(self, key: str) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key, _MISSING) is not _MISSING

    def keys(self) -> Any:
        self.flush()  # iterating reads the stores: what is staged goes there first
        return super().keys()

    def items(self) -> Any:
        self.flush()
        return super().items()

    def values(self) -> Any:
        self.flush()
        return super().values()

    def __iter__(self) -> Any:
        self.flush()
        return super().__iter__()

    def _read(self, key: bytes) -> bytes | None:
        store: Any = self.data
        partition = self._current_partition()
        if partition is not None:
            return store._db_for_partition(partition).get(key)
        for db in list(store._dbs.values()):  # a web view: whichever partition this worker holds it in
            value = db.get(key)
            if value is not None:
                return value
        return None

    @staticmethod
    def _current_partition() -> int | None:
        partition = _partition.get()
        if partition is not None:
            return partition
        event = current_event()
        return None if event is None else event.message.partition


    def scan(self, partition: int, after: bytes | None, limit: int) -> tuple[list[tuple[str, Any]], bytes | None]:
        """Up to ``limit`` entries of one partition's local store after the key ``after``, in key order, decoded
        (fast, with orjson: an integer past 64 bits comes back as a float; the expiry sweep reads states and
        times only); and the key to go on from (None once the partition's end is reached).

        Faust's own iteration walks every active partition from its start; the expiry sweep reads a slice at a
        time instead. Faust 0.15.3's RocksDB store keeps one rocksdict database per partition (``_dbs``); this is
        the one place that reads it. A partition this worker has no database for (revoked) gives nothing.
        """
        store = self.data
        db = getattr(store, "_dbs", {}).get(partition)
        if db is None:
            return [], None
        skip = getattr(store, "offset_key", None)
        entries: list[tuple[str, Any]] = []
        for raw_key, raw_value in (db.items(from_key=after) if after is not None else db.items()):
            if raw_key == after or raw_key == skip:
                continue
            if len(entries) == limit:
                return entries, after
            after = raw_key
            try:
                key = orjson.loads(raw_key)  # Faust stores a str key as JSON (b'"task-1"'), whatever the schema says
                if isinstance(key, str):
                    entries.append((key, orjson.loads(raw_value)))
            except ValueError:  # orjson's JSONDecodeError included
                continue  # not an entry this app wrote: left alone
        return entries, None


class PromptTableManager(faust.tables.TableManager):
    """Faust's table manager without the second it sleeps before it registers the tables.

    Faust waits 1 s at start in case tables are still being declared (by agents as they start). Every table
    of this app is declared by ``define_tables`` before the worker starts, and Faust refuses one declared later
    ("Too late to add tables"), so the second is only a delay: it was about a fifth of a worker's start here,
    and every start (a restart, a scale-out, a failover) paid it.
    """

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


@dataclass(frozen=True)
class Tables:
    """Every table of the app. The ledger agent is the only writer of each (DESIGN.md "One writer per table")."""

    tasks: LedgerTable  # task_id → TaskRecord JSON, plus poison markers and spend (agents_stream.tables.leases)
    answers: LedgerTable  # task fingerprint → the last good answer (the cache tier)
    jobs: LedgerTable  # job_id → JobRecord JSON (agents_stream.tables.jobs)
    timers: LedgerTable  # parked tasks and running jobs: what the scanner watches

    def all(self) -> list[LedgerTable]:
        return [self.tasks, self.answers, self.jobs, self.timers]


def _table(app: faust.App, settings: Settings, name: str, help: str) -> LedgerTable:
    """A table the ledger owns: str keys, plain versioned JSON values (never pickled), RocksDB via rocksdict."""
    table = LedgerTable(
        app,
        name=name,
        default=None,
        partitions=settings.partitions,
        schema=faust.Schema(key_type=str, key_serializer="raw", value_serializer="json"),
        beacon=app.tables.beacon,
        help=help,
        options={
            "driver": "rocksdict",
            "block_cache_size": settings.rocksdb_cache_mb * 1024 * 1024,
            "write_buffer_size": 4 * 1024 * 1024,
            "max_write_buffer_number": 2,
        },
    )
    app.tables.add(table)  # returns the table it was given
    return table


def define_tables(app: faust.App, settings: Settings) -> Tables:
    """Add the app's tables to ``app`` (Faust recovers them at start) and return them."""
    return Tables(
        tasks=_table(app, settings, "tasks", "Task ledger: idempotency, leases and stored results, keyed by task_id."),
        answers=_table(
            app, settings, "answers",
            "Last good answer per task fingerprint (agent + instruction + context), for the cache tier.",
        ),
        jobs=_table(app, settings, "jobs", "Jobs: plan, each step's status and output, the stored job result."),
        timers=_table(
            app, settings, "timers",
            "Tasks awaiting approval or running after one, and running jobs: what the scanner watches.",
        ),
    )
