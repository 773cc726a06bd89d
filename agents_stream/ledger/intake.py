"""What an incoming record tells the ledger before any table access: its key's home partition, its requeue headers."""

from __future__ import annotations

from typing import Any

from faust.types import TP

from agents_stream.contract import topics
from agents_stream.kafka.outbox import Outbox

REQUEUE_HEADER, HISTORY_HEADER = topics.REQUEUE_HEADER, topics.HISTORY_HEADER


def moved(
    outbox: Outbox, partitions: int, tp: TP, offset: int, key: str, value: bytes | None, headers: Any,
) -> bool:
    """A record that is not on its key's partition (keyless, or another partitioner such as librdkafka's)
    is sent there first, because the tables keep that key on that partition; True when it was moved."""
    raw = key.encode("utf-8")
    home = topics.partition_for(raw, partitions)
    if home == tp.partition:
        return False
    reroute = list(headers or []) + [("agents_stream.rerouted_from", f"{tp.topic}:{tp.partition}:{offset}".encode())]
    outbox.deliver(tp, offset, [outbox.record(tp.topic, raw, value, partition=home, headers=reroute)])
    return True


def requeue_headers(headers: Any) -> tuple[str | None, str | None]:
    """(requeue id, history JSON) from a task message's headers; (None, None) for an ordinary task."""
    requeue_id = history = None
    for name, value in headers or ():
        try:
            if name == REQUEUE_HEADER:
                requeue_id = value.decode("utf-8")
            elif name == HISTORY_HEADER:
                history = value.decode("utf-8")
        except (AttributeError, UnicodeDecodeError):
            continue  # a header we cannot read is not ours
    return requeue_id, history
