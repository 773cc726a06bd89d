"""The flow's check resumes input partitions Faust left paused only once Faust's rebalance is over: during one,
Faust pauses them until their tables are recovered, and a task message applied to a table partition still being
rebuilt finds no record (a finished task ran again and was answered twice, in the partition test)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import faust
from faust.types import TP

from agents_stream.kafka.consumer import Rereads, WatermarkConsumer
from agents_stream.kafka.flow import Flow
from agents_stream.kafka.watermark import Watermark

TASKS = TP("agent.tasks.a", 4)


class Consumer:
    """Faust's consumer as the flow reads it: every assigned partition paused (as Faust leaves them on assignment)."""

    def __init__(self) -> None:
        self.assigned = {TASKS}
        self.active: set[TP] = set()
        self.resumed: list[set[TP]] = []
        self.rereads = Rereads()

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
