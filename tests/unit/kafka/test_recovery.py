"""RecoveryWatch: a table recovery that stopped receiving changelog records is sought back to where it stands."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from faust.types import TP

from agents_stream.kafka.recovery import FETCHED_PAST_S, RecoveryWatch

A, B, C = TP("app-tasks-changelog", 1), TP("app-tasks-changelog", 3), TP("app-jobs-changelog", 1)


@dataclass
class Recovery:
    """What the watch reads of Faust's table recovery: whether one runs, and each changelog partition's applied
    offset and high watermark."""

    in_recovery: bool
    active_offsets: Counter[TP]
    active_highwaters: Counter[TP]


def recovery(offsets: dict[TP, int], highwaters: dict[TP, int], in_recovery: bool = True) -> Recovery:
    return Recovery(in_recovery, Counter(offsets), Counter(highwaters))


class Consumer:
    def __init__(self, on_position: Callable[[], None] = lambda: None, at: int = 99) -> None:
        self.seeks: list[tuple[TP, int]] = []
        self.on_position = on_position
        self.at = at  # the fetch position of every partition

    async def seek(self, tp: TP, offset: int) -> None:
        self.seeks.append((tp, offset))

    async def position(self, tp: TP) -> int:
        self.on_position()
        return self.at


@dataclass
class TableManager:
    recovery: Recovery


@dataclass
class App:
    """What the watch reads of the Faust app: its tables' recovery and its consumer."""

    tables: TableManager
    consumer: Consumer


def test_a_partition_with_records_left_and_no_progress_is_read_again_from_the_record_after_the_applied_one():
    watch = RecoveryWatch(app=None, stall_after_s=10)
    r = recovery({A: 12, B: -1, C: 5}, {A: 98, B: 40, C: 5})  # C is up to date
    assert watch.stalled(r, now=0) == {}
    assert watch.stalled(r, now=9.9) == {}
    assert watch.stalled(r, now=10) == {A: 13, B: 0}
    # reported once per period: the re-read gets another stall_after_s before the next report
    assert watch.stalled(r, now=15) == {}
    assert watch.stalled(r, now=20) == {A: 13, B: 0}


def test_a_partition_whose_applied_offset_moves_is_never_sought():
    watch = RecoveryWatch(app=None, stall_after_s=10)
    r = recovery({A: 12}, {A: 98})
    for now in range(0, 60, 5):
        r.active_offsets[A] += 1  # records keep arriving, slowly
        assert watch.stalled(r, now=now) == {}


def test_nothing_is_sought_outside_recovery_and_a_new_recovery_starts_its_clock_again():
    watch = RecoveryWatch(app=None, stall_after_s=10)
    stuck = recovery({A: 12}, {A: 98})
    assert watch.stalled(stuck, now=0) == {}
    assert watch.stalled(recovery({A: 12}, {A: 98}, in_recovery=False), now=11) == {}
    assert watch.stalled(stuck, now=12) == {}  # seen again for the first time: not yet
    assert watch.stalled(stuck, now=22) == {A: 13}


def test_check_seeks_the_stalled_partitions_through_the_consumer():
    consumer = Consumer()
    app = App(TableManager(recovery({A: 12, C: 5}, {A: 98, C: 5})), consumer)
    watch = RecoveryWatch(app=app, stall_after_s=10)
    asyncio.run(watch.check(now=0))
    asyncio.run(watch.check(now=10))
    assert consumer.seeks == [(A, 13)]


def test_a_recovery_that_ends_while_the_watch_asks_is_not_sought():
    r = recovery({A: 12}, {A: 98})

    def records_came_after_all() -> None:  # while the watch asked for the fetch position
        r.in_recovery = False

    consumer = Consumer(on_position=records_came_after_all)
    app = App(TableManager(r), consumer)
    watch = RecoveryWatch(app=app, stall_after_s=10)
    asyncio.run(watch.check(now=0))
    asyncio.run(watch.check(now=10))
    assert consumer.seeks == []


def test_records_fetched_past_and_never_applied_are_read_again_within_seconds():
    """The scale-out test's case: a tasks changelog partition applied up to 19 of 21, its fetch position at 22 (the
    records were fetched and dropped); it waited the whole stall_after_s (15 s) for its re-read."""
    consumer = Consumer(at=22)
    app = App(TableManager(recovery({A: 19}, {A: 21})), consumer)
    watch = RecoveryWatch(app=app, stall_after_s=15)
    asyncio.run(watch.check(now=0))
    asyncio.run(watch.check(now=FETCHED_PAST_S - 0.1))
    assert consumer.seeks == []
    asyncio.run(watch.check(now=FETCHED_PAST_S))
    assert consumer.seeks == [(A, 20)]


def test_a_slow_read_with_nothing_fetched_past_waits_the_whole_period():
    consumer = Consumer(at=20)  # the next fetch starts at the record recovery waits for: it is not dropped, only late
    app = App(TableManager(recovery({A: 19}, {A: 21})), consumer)
    watch = RecoveryWatch(app=app, stall_after_s=15)
    for now in (0, FETCHED_PAST_S, 2 * FETCHED_PAST_S, 14.9):
        asyncio.run(watch.check(now=now))
    assert consumer.seeks == []
    asyncio.run(watch.check(now=15))
    assert consumer.seeks == [(A, 20)]
