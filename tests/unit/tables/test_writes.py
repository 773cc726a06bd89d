"""Table writes staged and flushed once per loop iteration (tables/writes.py, LedgerTable in tables/definitions.py).

A key written twice before the flush is one changelog record with its last value; whoever waits for a write waits
for that record; reads see a staged write at once; keys are the bytes Faust has always written (JSON, ASCII).
Only confirmed writes survive a restart: a store holding a write the broker never confirmed is discarded when a
worker opens it again, and its partition recovered from the changelog.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import faust
import pytest
from agents_stream.tables.changelog import ChangelogRecord, RecoveryStarts
from agents_stream.tables.definitions import LedgerTable, define_tables, writing
from agents_stream.tables.writes import DELETED, Unconfirmed, WriteBuffer, chain
from faust.types import TP
from faust.types.tuples import RecordMetadata

from agents_stream.settings import Settings


async def _spin() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


# -- the write buffer (pure) ---------------------------------------------------------------------------------------

async def test_a_key_written_twice_before_the_flush_is_one_write_with_its_last_value_and_one_future() -> None:
    buffer = WriteBuffer()
    first = buffer.stage(3, "k", {"v": 1})
    second = buffer.stage(3, "k", {"v": 2})
    other = buffer.stage(3, "j", "x")
    assert first is second and other is not first
    assert buffer.lookup("k").value == {"v": 2}  # type: ignore[union-attr]
    buffer.stage(3, "j", DELETED)
    staged = buffer.take()
    assert [(key, write.value) for key, write in staged] == [("k", {"v": 2}), ("j", DELETED)]
    assert len(buffer) == 0 and buffer.lookup("k") is None


async def test_a_key_is_staged_in_one_partition_only() -> None:
    buffer = WriteBuffer()
    buffer.stage(1, "k", 1)
    with pytest.raises(ValueError, match="partition 2"):
        buffer.stage(2, "k", 2)


async def test_a_staged_future_settles_as_the_send_that_carries_it() -> None:
    loop = asyncio.get_running_loop()
    for settle in ("ok", ValueError("refused"), None):
        source, target = loop.create_future(), loop.create_future()
        chain(source, target)
        assert not target.done()
        if settle is None:
            source.cancel()
        elif isinstance(settle, Exception):
            source.set_exception(settle)
        else:
            source.set_result(settle)
        await _spin()
        if settle is None:
            assert target.cancelled()
        elif isinstance(settle, Exception):
            assert target.exception() is settle
        else:
            assert target.result() == "ok"
    done, target = loop.create_future(), loop.create_future()
    done.set_result("early")
    chain(done, target)
    assert target.result() == "early"


def test_a_partition_is_confirmed_once_every_local_write_of_it_is() -> None:
    """The offset to persist comes only when nothing written to the partition waits for the broker any more."""
    open_writes = Unconfirmed()
    open_writes.wrote(2, b"k", b"1")
    open_writes.wrote(2, b"j", None)
    open_writes.wrote(2, b"k", b"2")  # written again before the first record was confirmed
    assert 2 in open_writes and 3 not in open_writes
    assert open_writes.confirmed(2, b"k", b"1", 10) is None, "the key's later value is not confirmed yet"
    assert open_writes.confirmed(2, b"j", None, 11) is None
    assert open_writes.confirmed(2, b"k", b"2", 12) == 12 and 2 not in open_writes
    assert open_writes.confirmed(3, b"x", b"0", 4) == 4, "a retry's confirmation of a partition with nothing open"
    open_writes.wrote(2, b"k", b"3")
    assert open_writes.confirmed(2, b"other", b"9", 9) is None and open_writes.confirmed(2, b"k", b"3", 13) == 13


@dataclass(frozen=True)
class ChangelogMessage:
    """What a table reads of a changelog record it applies (Faust's Message)."""

    tp: TP
    partition: int
    offset: int
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)


@dataclass(frozen=True)
class ChangelogEvent:
    """A changelog record as Faust's recovery hands it to a table (its EventT: the message is what is read)."""

    message: ChangelogMessage


# -- LedgerTable: a real Faust table on a real RocksDB store, its changelog records left in the producer buffer ------

def _tables(tmp_path: Path) -> tuple[faust.App, LedgerTable]:
    app = faust.App("unit-ledger-table", broker="kafka://127.0.0.1:1", store="rocksdb://", datadir=str(tmp_path),
                    topic_partitions=4)  # never started: the changelog records stay in its producer buffer
    tasks = define_tables(app, Settings(partitions=4)).tasks
    assert isinstance(tasks, LedgerTable)
    return app, tasks


def _records(app: faust.App) -> list[tuple[bytes, bytes | None, int]]:
    """The changelog records sent so far (they wait in the unstarted producer's buffer)."""
    pending = app.producer.buffer.pending
    records = []
    while not pending.empty():
        message = pending.get_nowait().message
        records.append((message.key, message.value, message.partition))
    return records


async def test_writes_of_one_iteration_are_one_record_per_key_and_one_rocksdb_batch(tmp_path: Path) -> None:
    app, table = _tables(tmp_path)
    with writing(2):
        table["t-1"] = {"state": "running"}
        table["t-1"] = {"state": "succeeded"}
        table["spend|a"] = "0.5"
        waited = table.last_changelog
        assert table.get("t-1") == {"state": "succeeded"} and "t-1" in table, "a read sees the staged write"
        assert _records(app) == [], "nothing is sent before the loop turns"
    await _spin()
    assert _records(app) == [(b'"t-1"', b'{"state":"succeeded"}', 2), (b'"spend|a"', b'"0.5"', 2)]
    assert not waited.done(), "a write counts only once the broker confirmed its record"
    db = table.data._db_for_partition(2)
    assert db.get(json.dumps("t-1").encode()) == b'{"state":"succeeded"}'
    assert table.get("t-1") == {"state": "succeeded"} and table.get("missing") is None
    with writing(2):
        del table["t-1"]
        assert table.get("t-1") is None and "t-1" not in table
    await _spin()
    assert _records(app) == [(b'"t-1"', None, 2)] and db.get(json.dumps("t-1").encode()) is None


async def test_keys_are_written_as_faust_wrote_them_and_read_back_from_any_partition(tmp_path: Path) -> None:
    """A non-ASCII task id has the escaped JSON key of the records already in deployed stores and changelogs;
    a read outside any partition (a web view) finds it wherever this worker holds it."""
    app, table = _tables(tmp_path)
    with writing(1):
        table["tâche-é"] = {"n": 1}
    await _spin()
    [(key, _, _)] = _records(app)
    assert key == b'"t\\u00e2che-\\u00e9"' == json.dumps("tâche-é").encode()
    assert table.get("tâche-é") == {"n": 1}


async def test_a_write_outside_an_event_and_without_a_partition_is_refused(tmp_path: Path) -> None:
    _, table = _tables(tmp_path)
    with pytest.raises(TypeError, match="outside the ledger"):
        table["t-1"] = {"state": "running"}


async def test_an_integer_past_64_bits_is_written_and_read_back_exactly(tmp_path: Path) -> None:
    """A job's context or a model's answer may hold one: orjson refuses to write it (and reads it as a float);
    refusing it would stop the worker on the task's own data."""
    app, table = _tables(tmp_path)
    with writing(3):
        table["job-1"] = {"context": {"n": 10**20}}
    await _spin()
    [(_, value, _)] = _records(app)
    assert value == b'{"context":{"n":100000000000000000000}}'
    assert table.get("job-1") == {"context": {"n": 10**20}} and isinstance(table.get("job-1")["context"]["n"], int)


def _confirm(table: faust.Table, app: faust.App, offset: int) -> None:
    """The broker confirms every changelog record in the producer's buffer, from ``offset`` on."""
    pending = app.producer.buffer.pending
    while not pending.empty():
        fut = pending.get_nowait()
        tp = TP(table.changelog_topic.get_topic_name(), fut.message.partition)
        fut.set_result(RecordMetadata(tp.topic, tp.partition, tp, offset))
        table.changelog_confirmed(fut)  # what Faust's callback does once the broker answered
        offset += 1


def _reopened(app: faust.App, table: faust.Table, tmp_path: Path) -> tuple[faust.App, LedgerTable]:
    """The worker restarted on the same data dir (its stores closed, as a killed process leaves them)."""
    for db in table.data._dbs.values():
        db.close()
    table.data._dbs.clear()
    return _tables(tmp_path)


async def test_a_store_with_a_write_the_broker_never_confirmed_is_discarded_when_it_is_opened_again(
    tmp_path: Path,
) -> None:
    """Killed between the local write and the broker's answer: the restarted worker would otherwise answer from a
    record the changelog never got, and a later owner, recovering from the changelog, run the task again."""
    app, table = _tables(tmp_path)
    changelog = TP(table.changelog_topic.get_topic_name(), 2)
    with writing(2):
        table["t-1"] = {"state": "running"}
    await _spin()
    assert table.data.persisted_offset(changelog) is None, "no persisted offset while a write waits for the broker"
    _confirm(table, app, 7)
    assert table.data.persisted_offset(changelog) == 7
    with writing(2):
        table["t-1"] = {"state": "succeeded"}
    await _spin()
    assert table.data.persisted_offset(changelog) is None
    app, table = _reopened(app, table, tmp_path)  # killed before the broker answered
    assert table.persisted_offset(changelog) == -1, "recovered from the changelog's start"
    assert table.get("t-1") is None and table.data._db_for_partition(2).get(b'"t-1"') is None, (
        "the never-confirmed record is gone: the changelog's running record comes back by recovery"
    )


async def test_a_store_whose_writes_were_all_confirmed_is_kept_and_read_on_from_its_offset(tmp_path: Path) -> None:
    app, table = _tables(tmp_path)
    changelog = TP(table.changelog_topic.get_topic_name(), 1)
    with writing(1):
        table["t-1"] = {"state": "succeeded"}
        table["t-2"] = {"state": "running"}
    await _spin()
    _confirm(table, app, 40)
    assert table.data.persisted_offset(changelog) == 41
    app, table = _reopened(app, table, tmp_path)
    assert table.persisted_offset(changelog) == 41
    assert table.get("t-1") == {"state": "succeeded"} and table.get("t-2") == {"state": "running"}
    with writing(1):
        table["t-3"] = {"state": "running"}  # written while this worker runs: nothing is discarded any more
    await _spin()
    assert table.persisted_offset(changelog) == -1 and table.get("t-1") == {"state": "succeeded"}
    replayed = ChangelogEvent(ChangelogMessage(tp=changelog, partition=1, offset=44, key=b'"t-9"', value=b"1"))
    table.apply_changelog_batch([replayed])  # recovered again (assigned back) while t-3 waits for the broker
    assert table.data.persisted_offset(changelog) is None and table.get("t-9") == 1
    _confirm(table, app, 45)
    assert table.data.persisted_offset(changelog) == 45


async def test_a_stale_store_is_read_again_from_the_changelog_start_where_recovery_had_read_on(
    tmp_path: Path,
) -> None:
    """A write confirmed while this worker may have been out of the group makes its partition stale: the next time
    Faust's recovery adds the partition (Recovery._add, Faust's own code), the store is emptied and must be read from
    the changelog's start. Faust keeps the offset it had reached for a partition that stays assigned (active to
    standby) unless it is given another: with None it read the emptied store on from there, every record before
    it lost, and the chaos run ran finished tasks again."""
    from collections import Counter

    from faust.tables.recovery import Recovery

    app, table = _tables(tmp_path)
    changelog = TP(table.changelog_topic.get_topic_name(), 2)
    with writing(2):
        table["t-1"] = {"state": "succeeded"}
    await _spin()
    _confirm(table, app, 40)
    reached: Counter[TP] = Counter({changelog: 41})  # where recovery had read it, as a standby, say
    table.trusted = lambda: False  # the group may have expelled this worker meanwhile
    with writing(2):
        table["t-2"] = {"state": "running"}
    await _spin()
    _confirm(table, app, 42)
    # Faust's own Recovery._add, run on a stand-in of the Recovery it belongs to (only its tp_to_table is read)
    Recovery._add(SimpleNamespace(tp_to_table={}), table, changelog, reached)  # type: ignore[arg-type]
    assert reached[changelog] == -1, "read again from the changelog's start"
    assert table.get("t-1") is None and table.get("t-2") is None, "the stale store was emptied"


def test_only_the_first_record_after_a_start_is_checked_for_a_gap() -> None:
    """A recovery or standby that starts reading at 10 and gets 14 first never applied 10..13; a later jump is
    not checked (a compacted changelog has gaps of its own), and a new start is checked again."""
    starts = RecoveryStarts()
    assert starts.first(1, 14) is None, "no start known: nothing to check"
    starts.start(1, 10)
    starts.start(2, 3)
    assert starts.first(1, 14) == 10
    assert starts.first(1, 20) is None, "only the first record"
    assert starts.first(2, 3) is None, "the first record at the start: nothing missing"
    starts.start(1, 30)
    assert starts.first(1, 29) is None, "before the start (a record read again): nothing missing"
    starts.start(1, 30)
    assert starts.first(1, 31) == 30


async def test_records_dropped_before_the_first_one_a_recovery_gets_are_read_again_and_applied_in_order(
    tmp_path: Path,
) -> None:
    """The chaos run: a restarted worker's recovery of a tasks changelog partition got only the records another
    worker wrote after its seek; Faust counted the partition recovered, and tasks finished before those records ran
    again. The records before the first one are read again (here from a fake reader) and applied before it and
    after what Faust buffered before it, so each key ends at its latest value."""
    app, table = _tables(tmp_path)
    changelog = TP(table.changelog_topic.get_topic_name(), 3)
    other = TP(table.changelog_topic.get_topic_name(), 2)
    assert table.persisted_offset(changelog) == -1  # an empty store: Faust reads the partition from its start
    asked: list[tuple[TP, int, int]] = []

    async def reader(tp: TP, start: int, end: int) -> list[ChangelogRecord]:
        asked.append((tp, start, end))
        return [ChangelogRecord(tp, 1, b'"t-1"', b'{"state": "running"}'),
                ChangelogRecord(tp, 2, b'"t-1"', b'{"state": "succeeded"}'),
                ChangelogRecord(tp, 3, b'"t-2"', b'{"state": "running"}')]

    table.read_changelog = reader
    buffer = app.tables.recovery.buffers[table]
    before = ChangelogEvent(ChangelogMessage(tp=other, partition=2, offset=7, key=b'"t-8"', value=b'"other"'))
    first = ChangelogEvent(ChangelogMessage(tp=changelog, partition=3, offset=5, key=b'"t-2"',
                                            value=b'{"state": "succeeded"}'))
    buffer.extend([before, first])  # as Faust's recovery loop does before it calls the hook
    await table.on_changelog_event(first)

    assert asked == [(changelog, 0, 5)]
    assert buffer == [first], "what Faust buffered before the first record is applied before the records read again"
    assert table.get("t-8") == "other" and table.get("t-1") == {"state": "succeeded"}
    table.apply_changelog_batch(buffer)  # Faust applies its buffer later: the first record after the gap's
    assert table.get("t-2") == {"state": "succeeded"}, "the record read again did not overwrite a later one"
    second = ChangelogEvent(ChangelogMessage(tp=changelog, partition=3, offset=9, key=b'"t-3"', value=b"1"))
    await table.on_changelog_event(second)
    assert asked == [(changelog, 0, 5)], "only the first record after a start is checked"


async def test_a_gap_that_cannot_be_read_again_makes_the_partition_rebuilt_next_time(tmp_path: Path) -> None:
    app, table = _tables(tmp_path)
    changelog = TP(table.changelog_topic.get_topic_name(), 1)
    table.persisted_offset(changelog)

    async def down(tp: TP, start: int, end: int) -> list[ChangelogRecord]:
        raise ConnectionError("brokers unreachable")

    table.read_changelog = down
    first = ChangelogEvent(ChangelogMessage(tp=changelog, partition=1, offset=4, key=b'"t-1"', value=b"1"))
    app.tables.recovery.buffers[table].append(first)
    await table.on_changelog_event(first)
    assert 1 in table.stale, "its store is rebuilt from the changelog the next time this worker is assigned it"
