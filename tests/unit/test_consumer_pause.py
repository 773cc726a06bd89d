"""Pausing intake must not drop the batch Faust is delivering (agents_stream.kafka.consumer.WatermarkConsumer)."""

from __future__ import annotations

import faust
from faust.types import TP

from agents_stream.kafka.consumer import WatermarkConsumer


async def _ignore(*args: object) -> None:
    return None


def test_pausing_keeps_the_batch_in_delivery() -> None:
    """Faust's getmany checks each record of a batch against the active-partition set it started with;
    a pause must take effect for the next fetch without emptying that set under the running batch."""
    app = faust.App("test-consumer-pause", broker="kafka://127.0.0.1:1")  # never started: no connection
    consumer = WatermarkConsumer(
        app.transport, callback=_ignore, on_partitions_revoked=_ignore, on_partitions_assigned=_ignore,
    )
    a, b = TP("agent.tasks.x", 0), TP("agent.tasks.x", 1)
    consumer.resume_partitions({a, b})
    # The set Faust's getmany holds while it yields a batch: the one object the override must not empty. It is
    # Faust's own method (the state WatermarkConsumer.pause_partitions replaces), not one of ours.
    in_delivery = consumer._get_active_partitions()

    consumer.pause_partitions({a})

    assert a in in_delivery, "the rest of the batch of a paused partition is still delivered"
    assert consumer.active_partitions() == {b}, "the next fetch skips the paused partition"
    assert consumer.paused_partitions() == {a}
    consumer.resume_partitions({a})
    assert consumer.active_partitions() == {a, b} and not consumer.paused_partitions()
