"""A lease this worker wrote whose record the broker has not yet confirmed (a changelog partition's leader cut
off): the dispatch waits for the record (ledger/effects.py), and its lease is this live worker's, not one to let
lapse. Letting it lapse re-dispatched the task on the same worker until max_attempts dead-lettered it unanswered
(the partition test: 7 tasks in agent.tasks.analyst.dlq, "the lease lapsed 3 times", none ever run)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agents_stream.tables.definitions import Tables
from agents_stream.tables.leases import RUNNING, TaskRecord
from faust.types import TP

from agents_stream.contract import topics
from agents_stream.contract.events import LeaseExpired, encode
from agents_stream.contract.models import TaskPayload
from agents_stream.kafka.outbox import Outbox
from agents_stream.kafka.watermark import Watermark
from agents_stream.ledger import ledger as ledger_module
from agents_stream.ledger.ledger import Ledger
from agents_stream.ops.notify import Notifier
from agents_stream.settings import Settings
from tests.unit.ledger_fakes import ConfirmingChannel, FakeRuns, PlainTable, faust_event

TASK = TaskPayload(task_id="t1", agent_name="a", instruction="Sum it up.")
HOME = topics.partition_for(b"t1", Settings().partitions)  # the task's own partition: not moved there first
TASKS = TP("agent.tasks.a", HOME)
OUTCOMES = TP(topics.outcomes_topic(Settings().app_id), HOME)


class StoppedClock:
    """The ledger module's ``time`` with its clock stopped at ``now`` (the rest of the process keeps its own)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


class SlowTable(PlainTable):
    """A table whose changelog writes wait for the broker until ``confirm`` (its partition's leader is cut off)."""

    def __init__(self) -> None:
        super().__init__()
        self.unconfirmed: list[asyncio.Future[Any]] = []
        self.last_changelog: asyncio.Future[Any] | None = None

    def __setitem__(self, key: str, value: Any, /) -> None:
        super().__setitem__(key, value)
        self.last_changelog = asyncio.get_running_loop().create_future()
        self.unconfirmed.append(self.last_changelog)

    def confirm(self) -> None:
        for fut in self.unconfirmed:
            if not fut.done():
                fut.set_result("ok")


def _world() -> tuple[Ledger, SlowTable, list[tuple[str, int]]]:
    dispatched: list[tuple[str, int]] = []
    runs = FakeRuns(on_dispatch=lambda asked: dispatched.append((asked.task.task_id, asked.dispatch)))
    outbox = Outbox(ConfirmingChannel, Watermark(), "w1", find_dead_letter=_no_lookup, confirm_timeout_s=3600.0)
    tasks = SlowTable()
    tables = Tables(tasks=tasks, answers=SlowTable(), jobs=SlowTable(), timers=SlowTable())
    ledger = Ledger(Settings(), executor=runs, worker_id="w1", tables=tables,
                    watermark=outbox.watermark, outbox=outbox, notifier=Notifier())
    return ledger, tasks, dispatched


async def _no_lookup(dlq: str, source: tuple[str, int, int], since: float) -> None:
    return None


async def _spin() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_a_lease_whose_record_waits_for_the_broker_does_not_lapse_on_its_own_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ledger, tasks, dispatched = _world()
    ledger.handle(faust_event(TASKS, 0, b"t1", TASK.model_dump_json().encode()))
    await _spin()
    assert dispatched == [], "the dispatch waits for its lease record"
    record = TaskRecord.from_json(tasks["t1"])
    assert record.state == RUNNING and record.owner == "w1" and record.dispatch == 1

    later = record.lease_until + 5 * Settings().lease_ttl_s  # the broker stays silent past the lease, many times
    assert ledger.scan(later) == [], "the scanner asked to re-dispatch a task its own worker is about to start"

    monkeypatch.setattr(ledger_module, "time", StoppedClock(later))
    for offset in range(Settings().max_attempts):  # a LeaseExpired sent anyway (by an earlier scan) changes nothing
        ledger.handle(faust_event(OUTCOMES, offset, b"t1", encode(LeaseExpired(dispatch=1, worker="w1"))))
        await _spin()
    record = TaskRecord.from_json(tasks["t1"])
    assert (record.state, record.dispatch, record.owner) == (RUNNING, 1, "w1")

    tasks.confirm()  # the cut heals: the lease record is durable and its dispatch starts
    await _spin()
    assert dispatched == [("t1", 1)]


async def test_a_dispatch_waiting_on_a_partition_that_moved_holds_no_lease_here() -> None:
    """Revoked before its record was durable: the next owner recovers the task, and this worker's scanner no
    longer counts the dispatch as its own."""
    ledger, _, dispatched = _world()
    ledger.handle(faust_event(TASKS, 0, b"t1", TASK.model_dump_json().encode()))
    await _spin()
    assert ledger.scanner.running_here("t1", 1)
    ledger.forget({TASKS, OUTCOMES})
    assert not ledger.scanner.running_here("t1", 1) and dispatched == []
