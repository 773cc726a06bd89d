"""The changelog-backed tables of one app: defined once, passed to whoever reads or writes them."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import faust
import orjson
from agents_stream.tables.changelog import ChangelogState
from agents_stream.tables.epochs import header
from agents_stream.tables.writes import (
    DELETED,
    WriteBuffer,
    chain,
    current_partition,
    key_bytes,
    unanswered,
    value_bytes,
    writing,
)
from rocksdict import WriteBatch

from agents_stream.settings import Settings

__all__ = ["KeyedTable", "LedgerTable", "PromptTableManager", "ScannedTable", "Tables", "define_tables", "scan_store",
           "writing"]

log = logging.getLogger(__name__)

_MISSING = object()


class KeyedTable(Protocol):
    """A table as the ledger's parts read and write it (``LedgerTable`` is one; the unit tests' tables too): keys to
    JSON values, and the changelog sends the outbox holds an event's offset for (``Outbox.changelog``)."""

    #: the future of the last write's changelog send
    last_changelog: Any

    def get(self, key: str, default: Any = None, /) -> Any: ...

    def __getitem__(self, key: str, /) -> Any: ...

    def __setitem__(self, key: str, value: Any, /) -> None: ...

    def __delitem__(self, key: str, /) -> None: ...

    def __contains__(self, key: object, /) -> bool: ...

    def __iter__(self) -> Iterator[str]: ...

    def keys(self) -> Any: ...

    def items(self) -> Any: ...

    def values(self) -> Any: ...

    def send_changelog(self, partition: int, key: str, value: Any, /) -> Any: ...


class ScannedTable(KeyedTable, Protocol):
    """A table whose partitions' local stores can also be read a slice at a time (the expiry sweep, idle
    conversations): ``LedgerTable.scan``."""

    def scan(
        self, partition: int, after: bytes | None, limit: int, /,
    ) -> tuple[list[tuple[str, Any]], bytes | None]: ...


class LedgerTable(ChangelogState, faust.Table):
    """A Table whose writes are coalesced and flushed once per loop iteration, each with a future to await.

    Faust sends a changelog record per write, fire-and-forget (docs/faust.md, "Tables"), and encodes each value
    twice (store and changelog). Here a write is staged (``tables/writes.py``); reads see it at once; the flush,
    scheduled on the event loop by the first write, encodes each key's last value once, writes one RocksDB batch
    per partition and sends one changelog record per key. ``last_changelog`` is the future of the last write:
    it settles with the broker's answer for the record that carries it, and the ledger holds its offsets until then.

    A write takes its partition from the Faust event being handled, as Faust's own does, or from ``writing``.

    Owner epochs (``tables/epochs.py``): a partition this worker takes over gets a higher epoch (``claim_epoch``), which
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
        self.init_changelog_state()
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
                raw_key = key_bytes(key)
                value = None if write.value is DELETED else value_bytes(write.value)
                batch = batches.get(write.partition)
                if batch is None:
                    batch = batches[write.partition] = WriteBatch(raw_mode=True)
                    batch.delete(store.offset_key)  # back once the broker confirmed it all (changelog_confirmed)
                if value is None:
                    batch.delete(raw_key)
                else:
                    batch.put(raw_key, value)
                records.append((write, raw_key, value))
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
        for write, raw_key, value in records:
            self.unconfirmed.wrote(write.partition, raw_key, value)
            chain(self._send_raw(write.partition, raw_key, value), write.sent)

    def send_changelog(
        self, partition: Any, key: Any, value: Any, key_serializer: Any = None, value_serializer: Any = None,
    ) -> Any:
        """One changelog record of ``key`` with ``value`` (None: a tombstone); an outbox retry calls this."""
        raw = None if value is None else value_bytes(value)
        return self._send_raw(partition, key_bytes(key), raw)

    def _send_raw(self, partition: int, key: bytes, value: bytes | None) -> Any:
        if self.broken is not None:  # the store refused a write: nothing of this table counts as durable any more
            failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            failed.set_exception(self.broken)
            return failed
        if self._unanswered is not None and value is not None and self._unanswered in value:
            log.warning("Test fault: the changelog record of %s in table %s is never sent", key, self.name)
            return asyncio.get_running_loop().create_future()  # never settles, as if the broker never answered
        epoch = self.epochs.get(partition)
        headers = [header(epoch)] if epoch is not None else None
        direct = getattr(self.app.producer, "direct", None)  # the worker's IdempotentProducer has one
        if direct is not None and not self.app.in_transaction:
            sent = direct.send(self.changelog_topic.get_topic_name(), key, value, partition=partition, headers=headers)
            sent.add_done_callback(partial(self._direct_sent, key, value))
            return sent
        # Faust's own send (Collection.send_changelog) with the epoch's header: its callback keeps the partition's
        # persisted changelog offset in RocksDB.
        return self.changelog_topic.send_soon(
            key=key, value=value, partition=partition, key_serializer="raw", value_serializer="raw",
            callback=self._on_changelog_sent, eager_partitioning=True, headers=headers,
        )

    def _direct_sent(self, key: bytes, value: bytes | None, sent: "asyncio.Future[Any]") -> None:
        """A direct send of a changelog record settled: once confirmed, the partition's persisted offset may move."""
        if not sent.cancelled() and sent.exception() is None:
            self.record_confirmed(sent.result(), key, value)

    # -- reads ---------------------------------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        """The key's value: a staged write first, then the store (the current partition's, when one is known)."""
        write = self.staged.lookup(key)
        if write is not None:
            return default if write.value is DELETED else write.value
        raw = self._read(key_bytes(key))
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
        return current_partition()


    def scan(self, partition: int, after: bytes | None, limit: int) -> tuple[list[tuple[str, Any]], bytes | None]:
        """Up to ``limit`` entries of one partition's local store after the key ``after`` (``scan_store``)."""
        return scan_store(self.data, partition, after, limit)


def scan_store(
    store: Any, partition: int, after: bytes | None, limit: int,
) -> tuple[list[tuple[str, Any]], bytes | None]:
    """Up to ``limit`` entries of one partition's local store after the key ``after``, in key order, decoded
    (fast, with orjson: an integer past 64 bits comes back as a float; the expiry sweep reads states and
    times only); and the key to go on from (None once the partition's end is reached).

    Faust's own iteration walks every active partition from its start; the expiry sweep reads a slice at a
    time instead. Faust 0.15.3's RocksDB store keeps one rocksdict database per partition (``_dbs``); this is
    the one place that reads it. A partition this worker has no database for (revoked) gives nothing.
    """
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
    """Every table of the app. The ledger agent is the only writer of each (docs/faust.md, "Tables")."""

    tasks: ScannedTable  # task_id → TaskRecord JSON, plus poison markers and spend (agents_stream.tables.leases)
    answers: KeyedTable  # task fingerprint → the last good answer (the cache tier)
    jobs: KeyedTable  # job_id → JobRecord JSON (agents_stream.tables.jobs)
    timers: KeyedTable  # parked tasks and running jobs: what the scanner watches
    #: conversation_id → ConversationRecord JSON (agents_stream.tables.conversations); a plain dict in unit tests
    #: that have no conversations
    conversations: ScannedTable = field(default_factory=dict)  # type: ignore[assignment]

    def all(self) -> list[LedgerTable]:
        """The app's Faust tables (a worker's are all of them; a unit test's stand-ins are none)."""
        tables = [self.tasks, self.answers, self.jobs, self.timers, self.conversations]
        return [table for table in tables if isinstance(table, LedgerTable)]


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
        conversations=_table(
            app, settings, "conversations",
            "Conversations: their messages, runs and replies, keyed by conversation_id.",
        ),
    )
