"""An in-memory ``agent.circuits`` for tests: one ordered log that several workers' ``Circuits`` send to and fold."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from aiokafka.structs import ConsumerRecord, RecordMetadata, TopicPartition

from agents_stream.contract import topics
from agents_stream.resilience.circuits import Circuits

__all__ = ["MemoryCircuitsLog"]

#: what the topic is created with (LogAppendTime): the fold takes the "broker's" time
LOG_APPEND_TIME = 1


class MemoryCircuitsLog:
    """One partition: ``send`` appends with the next offset and the clock's time; attached Circuits fold it.

    Delivery happens on the next loop turn after a send, into every attached Circuits, in offset order.
    ``pause`` holds delivery (records still append) until ``resume`` or an explicit ``deliver``, so a test
    can decide when each worker sees the log.

    >>> log = MemoryCircuitsLog(clock=time.time)
    >>> circuits = Circuits(config, ["p"], "w0", send=log.send, ...)
    >>> log.attach(circuits)
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.records: list[ConsumerRecord[bytes, bytes]] = []
        self.paused = False
        self._readers: list[tuple[Circuits, list[int]]] = []  # each with the next offset it folds
        self._scheduled = False

    def send(self, key: bytes, value: bytes) -> asyncio.Future[RecordMetadata]:
        """Append one record; the future resolves at once with its metadata (this broker never fails)."""
        offset = len(self.records)
        timestamp = int(self.clock() * 1000)
        self.records.append(ConsumerRecord(
            topic=topics.CIRCUITS, partition=0, offset=offset, timestamp=timestamp, timestamp_type=LOG_APPEND_TIME,
            key=key, value=value, checksum=None, serialized_key_size=len(key), serialized_value_size=len(value),
            headers=(),
        ))
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[RecordMetadata] = loop.create_future()
        tp = TopicPartition(topics.CIRCUITS, 0)
        fut.set_result(RecordMetadata(tp.topic, tp.partition, tp, offset, timestamp, LOG_APPEND_TIME, 0))
        self._schedule()
        return fut

    def attach(self, circuits: Circuits, *, from_offset: int = 0) -> None:
        """Fold the log into ``circuits`` from ``from_offset`` on (what is there already on the next loop turn)."""
        circuits.begin(from_offset)
        self._readers.append((circuits, [from_offset]))
        if from_offset < len(self.records):
            self._schedule()

    def pause(self) -> None:
        """Hold delivery: records append but no Circuits folds them until ``resume`` or ``deliver``."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._schedule()

    def deliver(self) -> None:
        """Fold now, into every attached Circuits, whatever it has not folded yet (paused or not)."""
        for circuits, cursor in self._readers:
            new = self.records[cursor[0]:]
            cursor[0] = len(self.records)
            if new:
                circuits.fold(new)

    def _schedule(self) -> None:
        if self._scheduled or self.paused:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a sync test): delivery waits for an explicit deliver()
            return
        self._scheduled = True
        loop.call_soon(self._deliver_soon)

    def _deliver_soon(self) -> None:
        self._scheduled = False
        if not self.paused:
            self.deliver()
