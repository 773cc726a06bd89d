"""Pausing intake must not drop the batch Faust is delivering (agents_stream.kafka.consumer.WatermarkConsumer)."""

from __future__ import annotations

from faust.types import TP

from agents_stream.kafka.consumer import WatermarkConsumer


def test_pausing_keeps_the_batch_in_delivery() -> None:
    """Faust's getmany checks each record of a batch against the active-partition set it started with;
    a pause must take effect for the next fetch without emptying that set under the running batch."""
    consumer = object.__new__(WatermarkConsumer)  # only the partition bookkeeping is exercised
    a, b = TP("agent.tasks.x", 0), TP("agent.tasks.x", 1)
    consumer._active_partitions = {a, b}
    consumer._paused_partitions = set()
    in_delivery = consumer._get_active_partitions()  # what getmany holds while it yields the batch

    consumer.pause_partitions({a})

    assert a in in_delivery, "the rest of the batch of a paused partition is still delivered"
    assert consumer._get_active_partitions() == {b}, "the next fetch skips the paused partition"
    assert consumer._paused_partitions == {a}
    consumer.resume_partitions({a})
    assert consumer._get_active_partitions() == {a, b} and not consumer._paused_partitions
