"""The flow's check resumes input partitions Faust left paused only once Faust's rebalance is over: during one,
Faust pauses them until their tables are recovered, and a task message applied to a table partition still being
rebuilt finds no record (a finished task ran again and was answered twice, in the partition test)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import faust
from faust.types import TP

from agents_stream.kafka.consumer import WatermarkConsumer
from agents_stream.kafka.flow import REREAD_AGAIN_S, Flow
from agents_stream.kafka.rereads import Rereads
from agents_stream.kafka.watermark import Watermark

TASKS = TP("agent.tasks.a", 4)


class Consumer:
    """Faust's consumer as the flow reads it: every assigned partition paused (as Faust leaves them on assignment)."""

    def __init__(self) -> None:
        self.assigned = {TASKS}
        self.active: set[TP] = set()
        self.resumed: list[set[TP]] = []
        self.rereads = Rereads()
        self.sought: list[tuple[TP, int]] = []  # the re-reads' seeks, in order

    def assignment(self) -> set[TP]:
        return set(self.assigned)

    def active_partitions(self) -> set[TP]:
        return set(self.active)

    def buffered_partitions(self) -> set[TP]:
        return set()

    def resume_partitions(self, tps: set[TP]) -> None:
        self.resumed.append(set(tps))
        self.active |= tps

    def pause_partitions(self, tps: set[TP]) -> None:
        self.active -= tps

    async def earliest_offsets(self, *tps: TP) -> dict[TP, int]:
        return dict.fromkeys(tps, 0)

    async def highwaters(self, *tps: TP) -> dict[TP, int]:
        return dict.fromkeys(tps, 100)  # records waiting on every partition

    async def read_again(self, tp: TP, offset: int) -> None:
        self.sought.append((tp, offset))


@dataclass
class Recovery:
    """Faust's table recovery as the flow reads it: the event a new recovery sets when it starts."""

    signal_recovery_start: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class TableManager:
    recovery: Recovery = field(default_factory=Recovery)


@dataclass
class App:
    """The Faust app as the flow reads it (``kafka.flow.FlowApp``)."""

    consumer: Consumer
    in_recovery: bool = False
    rebalancing: bool = False
    tables: TableManager = field(default_factory=TableManager)


def _flow() -> tuple[Flow, App, Consumer]:
    consumer = Consumer()
    # a recovery of the generation before ended during this rebalance: Faust's "Worker ready" cleared the flag
    app = App(consumer)
    flow = Flow(app, Watermark(), frozenset({TASKS.topic}), ["a"], blocked=lambda agent: False,
                ready=lambda: True, alert=lambda event, details: None, stall_after_s=30.0)
    return flow, app, consumer


async def test_partitions_faust_paused_for_a_recovery_not_yet_started_stay_paused() -> None:
    flow, _, consumer = _flow()
    flow.assigned()  # Faust paused every assigned partition; its recovery has not begun reading (in_recovery unset)
    flow.check()
    assert consumer.resumed == [], "resumed while the table partitions were still to be recovered"
    flow.resumed()  # Faust's recovery ended: a partition still paused now is one it left paused (the check's case)
    flow.check()
    assert consumer.resumed == [{TASKS}]


async def test_the_end_of_a_stale_recovery_does_not_end_a_newer_rebalance() -> None:
    flow, app, consumer = _flow()
    flow.assigned()
    app.tables.recovery.signal_recovery_start.set()  # a later assignment asked for another recovery
    flow.resumed()
    flow.check()
    assert consumer.resumed == []


async def test_an_agent_unblocked_during_a_recovery_is_not_resumed_before_the_recovery_ends() -> None:
    """The chaos run's case: the breaker half-opened while a table partition was being rebuilt, the intake resumed
    the task partitions, and the ledger answered three tasks another worker had finished."""
    flow, _, consumer = _flow()
    blocked = {"a"}
    flow.blocked = lambda agent: agent in blocked
    flow.resumed()
    consumer.active = {TASKS}
    flow.update()
    assert consumer.active == set(), "a blocked agent's partitions are paused"
    flow.assigned()  # a rebalance: Faust pauses every assigned partition until its recovery ends
    blocked.clear()  # the provider answers again mid-recovery
    flow.update()
    assert consumer.resumed == [], "resumed while its table partition was still being recovered"
    flow.resumed()
    consumer.resume_partitions({TASKS})  # Faust resumes the streams once the recovery ended
    assert consumer.active == {TASKS}


def test_faust_resuming_the_streams_after_a_recovery_leaves_the_intakes_partitions_paused() -> None:
    app = faust.App("test-flow-held", broker="kafka://127.0.0.1:1")  # never started: no connection
    consumer = WatermarkConsumer(
        app.transport, callback=_ignore, on_partitions_revoked=_ignore, on_partitions_assigned=_ignore,
    )
    held, free = TP("agent.tasks.a", 0), TP("agent.tasks.a", 1)
    consumer.pause_partitions({held, free})
    consumer.held = frozenset({held})  # the intake holds it: its agent's provider is down

    consumer.resume_partitions({held, free})  # Faust's resume at the end of a recovery

    assert consumer.active_partitions() == {free}
    assert consumer.paused_partitions() == {held}
    consumer.held = frozenset()
    consumer.resume_partitions({held})
    assert consumer.active_partitions() == {held, free}


async def _ignore(*args: object) -> None:
    return None


def test_a_partition_that_delivers_nothing_after_a_rebalance_is_read_again_within_seconds() -> None:
    """The takeover test's case: after a SIGKILLed worker's partitions moved, Faust's fetcher delivered nothing of
    them, and their tasks waited for the progress check's full period (15 s) instead of being taken over."""
    from agents_stream.kafka.stall import StallDetector

    stalls = StallDetector(after_s=15.0, fresh_after_s=3.0)
    moved, quiet = TP("agent.tasks.a", 1), TP("agent.tasks.a", 2)
    stalls.restart_at({moved: 0, quiet: 4}, now=100.0)
    assert not stalls.observe(moved, 0, 2, now=102.0)
    assert stalls.observe(moved, 0, 2, now=103.5), "records waited 3.5 s after the rebalance and nothing arrived"
    assert not stalls.observe(quiet, 4, 4, now=103.5), "nothing waits there"
    # once a partition's position moved, the usual period holds again
    stalls.restart_at({moved: 0}, now=200.0)
    assert not stalls.observe(moved, 1, 2, now=201.0)
    assert not stalls.observe(moved, 1, 2, now=205.0)
    assert stalls.observe(moved, 1, 2, now=216.5)


async def _sought(consumer: Consumer, n: int) -> list[tuple[TP, int]]:
    """The seeks once ``n`` were made (a re-read seeks in the background), within a second."""
    for _ in range(1000):
        if len(consumer.sought) >= n:
            break
        await asyncio.sleep(0.001)
    return consumer.sought


async def test_a_gap_after_the_rebalance_sought_to_the_commits_is_read_again_before_faust_says_ready() -> None:
    """B4's case: records dropped after Faust's seek to the commits, reported while ``app.rebalancing`` was still
    set (Faust clears it after the seek, at "Worker ready"). The re-read was skipped as if the rebalance's seek were
    still to come, yet counted as made, so the progress check's re-read 2 s on was held back too, and the partition
    waited 17 s."""
    flow, app, consumer = _flow()
    flow.assigned()
    assert not flow.reread(TASKS, 5), "before the rebalance's own seek: that one reads from the commit"
    flow.resumed()  # Faust's recovery ended; it seeks to the commits now, then says "Worker ready"
    app.rebalancing = True
    assert flow.reread(TASKS, 5), "a gap seen after that seek is read again at once"
    assert await _sought(consumer, 1) == [(TASKS, 5)]


async def test_the_same_gap_reported_again_is_not_read_again_soon_unless_the_partition_stood_still() -> None:
    flow, _, consumer = _flow()
    flow.resumed()
    assert flow.reread(TASKS, 5)
    assert not flow.reread(TASKS, 5), (
        f"the ledger reports the gap once per record past it: read again only {REREAD_AGAIN_S} s after the seek")
    assert flow.reread(TASKS, 7), "another gap"
    assert flow.reread(TASKS, 5, stalled=True), "the progress check saw nothing arrive since: that seek delivered none"
    assert await _sought(consumer, 3) == [(TASKS, 5), (TASKS, 7), (TASKS, 5)]
    consumer.assigned = set()
    assert not flow.reread(TASKS, 9, stalled=True), "revoked: nothing to read"


async def test_the_progress_check_leaves_a_re_read_under_way_the_time_a_rebalances_seek_gets() -> None:
    """Right after a rebalance the ledger re-reads a gap at once; the progress check, finding the partition still
    unmoved a moment later, must not seek again before that re-read had its time (a second seek delivers the same
    records twice), and seeks once it had it."""
    from agents_stream.kafka.stall import StallDetector

    flow, _, consumer = _flow()
    flow.stalls = StallDetector(after_s=30.0, fresh_after_s=0.5)
    consumer.active = {TASKS}
    flow.watermark.start(TASKS, 5)
    flow.resumed()  # reading starts at 5, the group's commit
    await asyncio.sleep(0.6)
    assert flow.reread(TASKS, 5), "the ledger saw records past 5 only: a gap"
    await flow.check_progress()
    await asyncio.sleep(0.05)  # a seek runs in the background
    assert consumer.sought == [(TASKS, 5)], "the position stood still since the rebalance, but the re-read is new"
    await asyncio.sleep(0.6)
    await flow.check_progress()
    assert await _sought(consumer, 2) == [(TASKS, 5), (TASKS, 5)], "the re-read delivered nothing in its time"
