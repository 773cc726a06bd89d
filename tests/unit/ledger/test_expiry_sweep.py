"""Finished records expire: which entries are past their time to live and their task message gone from its topic,
the time to live against the task topics' retention, the sweep's slices of a real RocksDB (rocksdict) partition and
the log starts it asks the broker for, and the ledger tombstoning what the sweep found, once, and nothing that
changed since."""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from typing import Any

from agents_stream.tables import leases
from agents_stream.tables.definitions import Tables, scan_store
from agents_stream.tables.expiry import expired as expired_on_0
from faust.types import TP
from rocksdict import Options, Rdict

from agents_stream.contract import topics
from agents_stream.contract.events import RecordsExpired, encode
from agents_stream.ledger.expiry_sweep import Expiry
from agents_stream.ledger.ledger import Ledger
from agents_stream.ops.notify import Notifier
from agents_stream.settings import Settings
from tests.unit.ledger_fakes import FakeRuns, PlainTable, Table, faust_event, recording_outbox

NOW = 1_000_000.0
NO_OUTBOX, _ = recording_outbox()  # the sweep only reads: what it finds the test reads from its answer


@dataclass
class RocksStore:
    """Faust's RocksDB store as the sweep reads it: one rocksdict database per partition (``_dbs``), and the key
    Faust keeps the partition's changelog offset under."""

    _dbs: dict[int, Rdict]
    offset_key: bytes


class StoredTable(PlainTable):
    """A table whose scans read a real store (LedgerTable.scan's own reading, ``scan_store``)."""

    def __init__(self, store: RocksStore) -> None:
        super().__init__()
        self.store = store

    def scan(self, partition: int, after: bytes | None, limit: int, /) -> tuple[list[tuple[str, Any]], bytes | None]:
        return scan_store(self.store, partition, after, limit)
MINE = topics.outcomes_topic(Settings().app_id)
#: the task topic's log start is past offset 1 (the records' message) and 7 (the markers')
GONE = {("agent.tasks.a", 0): 8}


def expired(key: str, value: Any, *, now: float, ttl: float, log_starts: Any = GONE) -> bool:
    return expired_on_0(key, value, now=now, ttl=ttl, partition=0, log_starts=log_starts)


def _record(state: str, finished_at: float | None) -> dict[str, Any]:
    return leases.TaskRecord(
        state=state, agent="a", dispatch=1, owner="", lease_until=0.0, payload="{}", topic="agent.tasks.a",
        partition=0, offset=1, received_at=0.0, finished_at=finished_at,
    ).to_json()


def test_finished_records_and_sent_markers_expire_and_nothing_open_does() -> None:
    ttl = 100.0
    for state in leases.TERMINAL:
        assert expired("t", _record(state, NOW - 100), now=NOW, ttl=ttl)
        assert not expired("t", _record(state, NOW - 99), now=NOW, ttl=ttl), "not before its time"
    for state in (leases.RUNNING, leases.AWAITING_APPROVAL, leases.AWAITING_SUBTASKS):
        assert not expired("t", _record(state, NOW - 1e6), now=NOW, ttl=ttl), f"{state} never expires"
    assert not expired("t", _record(leases.SUCCEEDED, None), now=NOW, ttl=ttl)
    assert expired("\x00dead/agent.tasks.a/7", json.dumps({"at": NOW - 200}), now=NOW, ttl=ttl)
    assert not expired("\x00dead/agent.tasks.a/7", json.dumps({"sending": NOW - 200, "by": "w"}), now=NOW, ttl=ttl), (
        "a dead letter still being sent keeps its marker"
    )
    assert not expired("\x00spend/a/2026-12-01/0", 1.5, now=NOW, ttl=ttl)
    assert not expired("t", {"state": "succeeded", "finished_at": True}, now=NOW, ttl=ttl)


def test_an_entry_past_its_time_to_live_stays_while_its_task_message_can_be_read() -> None:
    """Kafka deletes closed segments only: a message outlives its retention by up to a segment (7 days by default),
    and a rewound group reading it must find its record, not run the task again."""
    old = _record(leases.SUCCEEDED, NOW - 1e6)
    marker = json.dumps({"at": NOW - 1e6})
    for starts in ({}, {("agent.tasks.a", 0): 0}, {("agent.tasks.a", 0): 1}, {("agent.tasks.a", 1): 9}):
        assert not expired("t", old, now=NOW, ttl=100, log_starts=starts), f"message at 1 still readable: {starts}"
    assert expired("t", old, now=NOW, ttl=100, log_starts={("agent.tasks.a", 0): 2}), "log start past offset 1"
    assert not expired("\x00dead/agent.tasks.a/7", marker, now=NOW, ttl=100, log_starts={("agent.tasks.a", 0): 7})
    assert expired("\x00dead/agent.tasks.a/7", marker, now=NOW, ttl=100, log_starts={("agent.tasks.a", 0): 8})
    before_it_came = {**old, "offset": -1}  # cancelled before its message arrived (tables/cancel.py)
    assert expired("t", before_it_came, now=NOW, ttl=100, log_starts={})
    assert not expired("t", {**old, "offset": None}, now=NOW, ttl=100), "a record naming no message is kept"
    assert not expired("t", _record(leases.SUCCEEDED, NOW - 99), now=NOW, ttl=100), "the message gone, not the TTL"


def test_the_time_to_live_is_never_shorter_than_the_task_topics_retention() -> None:
    def ttl(ttl_s: float, retention: float | None) -> float:
        return Expiry(Settings(record_ttl_s=ttl_s), PlainTable(), NO_OUTBOX).set_ttl(retention)

    assert ttl(0, 7 * 86400) == 7 * 86400, "0 means the retention"
    assert ttl(3600, 7 * 86400) == 7 * 86400, "a shorter setting is raised to the retention"
    assert ttl(30 * 86400, 7 * 86400) == 30 * 86400
    assert math.isinf(ttl(3600, None)), "a topic kept forever (or one the broker will not describe) keeps them"
    assert math.isinf(ttl(-1, 3600))


def test_the_sweep_reads_a_partition_in_slices_and_starts_over_at_its_end(tmp_path) -> None:
    opts = Options(raw_mode=True)
    db = Rdict(str(tmp_path / "tasks-0.db"), options=opts)
    offset_key = b"__faust\x00offset__"
    db[offset_key] = b"12"
    keys = [f"t{i:02d}" for i in range(7)]
    for i, key in enumerate(keys):
        finished = NOW - 500 if i % 2 == 0 else NOW - 10
        db[json.dumps(key).encode()] = json.dumps(_record(leases.SUCCEEDED, finished)).encode()  # as Faust keeps it
    expiry = Expiry(Settings(expiry_batch=3), StoredTable(RocksStore({0: db}, offset_key)), NO_OUTBOX)

    def sweep(partitions: set[int]) -> dict[int, list[str]]:  # as the worker's timer does it (Runtime.sweep_expired)
        expiry.keep(partitions)
        return {p: keys for p in sorted(partitions) if (keys := expiry.sweep_one(p, NOW))}

    assert sweep({0}) == {}, "nothing expires before the time to live is set"
    expiry.set_ttl(100.0)
    assert [sweep({0, 5}) for _ in range(3)] == [{}, {}, {}], "past the TTL, but no log start known yet"
    asked: list[tuple[TP, ...]] = []

    async def earliest(*tps: TP) -> dict[TP, int]:  # the broker's answer (the consumer's ListOffsets earliest)
        asked.append(tps)
        return {tp: 2 for tp in tps}

    asyncio.run(expiry.refresh(earliest))
    assert asked == [(TP("agent.tasks.a", 0),)], "the log start of the partition the records' messages are on"
    slices = [sweep({0, 5}) for _ in range(4)]
    assert slices == [{0: ["t00", "t02"]}, {0: ["t04"]}, {0: ["t06"]}, {0: ["t00", "t02"]}], (
        "three entries a tick, the offset key skipped, a partition without a database (5) gives nothing"
    )

    async def silent(*tps: TP) -> dict[TP, int]:
        raise asyncio.TimeoutError

    asyncio.run(expiry.refresh(silent))
    assert sweep({0}) == {0: ["t04"]}, "a broker that does not answer: the last log start it gave still holds"
    expiry.keep({5})
    assert expiry.log_starts == {}, "a partition given away forgets its log starts"
    db.close()


async def test_the_ledger_tombstones_what_is_still_expired_when_the_event_comes_back() -> None:
    outbox, sent = recording_outbox()
    tasks = Table()
    ledger = Ledger(Settings(), executor=FakeRuns(), worker_id="w1",
                    tables=Tables(tasks=tasks, answers=Table(), jobs=Table(), timers=Table()),
                    watermark=outbox.watermark, outbox=outbox, notifier=Notifier())
    ledger.expiry.set_ttl(100.0)
    ledger.expiry.log_starts = dict(GONE)
    now = time.time()
    tasks["old"] = _record(leases.SUCCEEDED, now - 1000)
    tasks["requeued"] = _record(leases.RUNNING, now - 1000)  # found expired, then requeued before the event
    tasks["\x00dead/agent.tasks.a/3"] = json.dumps({"at": now - 1000})
    tasks["readable"] = {**_record(leases.SUCCEEDED, now - 1000), "offset": 8}  # its message is still in the log
    event = RecordsExpired(keys=["old", "requeued", "\x00dead/agent.tasks.a/3", "gone", "readable"], worker="w1")
    ledger.handle(faust_event(TP(MINE, 0), 8, b"old", encode(event)))
    for _ in range(5):
        await asyncio.sleep(0)
    assert set(tasks) == {"requeued", "readable"}
    assert ledger.expiry.expired == 2 and ledger.watermark.commit_offset(TP(MINE, 0)) == 9, (
        "the event's offset commits once its tombstones are confirmed"
    )
