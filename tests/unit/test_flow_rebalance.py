"""The flow's check resumes input partitions Faust left paused only once Faust's rebalance is over: during one,
Faust pauses them until their tables are recovered, and a task message applied to a table partition still being
rebuilt finds no record (a finished task ran again and was answered twice, in the partition test)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from faust.types import TP

from agents_stream.kafka.flow import Flow
from agents_stream.kafka.watermark import Watermark

TASKS = TP("agent.tasks.a", 4)


class Consumer:
    """Faust's consumer as the flow reads it: every assigned partition paused (as Faust leaves them on assignment)."""

    def __init__(self) -> None:
        self.assigned = {TASKS}
        self.active: set[TP] = set()
        self.resumed: list[set[TP]] = []

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


def _flow() -> tuple[Flow, Any, Consumer]:
    consumer = Consumer()
    recovery = SimpleNamespace(signal_recovery_start=asyncio.Event())
    # a recovery of the generation before ended during this rebalance: Faust's "Worker ready" cleared the flag
    app = SimpleNamespace(consumer=consumer, in_recovery=False, rebalancing=False,
                          tables=SimpleNamespace(recovery=recovery))
    flow = Flow(app, Watermark(), frozenset({TASKS.topic}), ["a"], blocked=lambda agent: False,  # type: ignore[arg-type]
                ready=lambda: True, alert=lambda event, details: None, stall_after_s=30.0)
    return flow, app, consumer


async def test_partitions_faust_paused_for_a_recovery_not_yet_started_stay_paused() -> None:
    flow, _, consumer = _flow()
    flow.assigned()  # Faust paused every assigned partition; its recovery has not begun reading (in_recovery unset)
    flow.check()
    assert consumer.resumed == [], "resumed while the table partitions were still to be recovered"
    flow.settled()  # Faust's recovery ended: a partition still paused now is one it left paused (the check's case)
    flow.check()
    assert consumer.resumed == [{TASKS}]


async def test_the_end_of_a_stale_recovery_does_not_end_a_newer_rebalance() -> None:
    flow, app, consumer = _flow()
    flow.assigned()
    app.tables.recovery.signal_recovery_start.set()  # a later assignment asked for another recovery
    flow.settled()
    flow.check()
    assert consumer.resumed == []
