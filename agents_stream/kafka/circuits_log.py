"""The Kafka side of the circuits: reads ``agent.circuits`` (recent history, then follows) into ``Circuits.fold``."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any, Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from mode import Service

from agents_stream.contract import topics
from agents_stream.resilience.circuits import Circuits

__all__ = ["CircuitsLog"]

log = logging.getLogger(__name__)


class CircuitsLog(Service):
    """Owns the circuits' consumer, the follow loop, the presence (``hello``) loop and the success counts of one
    worker.

    ``start`` returns once the last ``history_s`` of the log are folded up to its end, so the
    worker calls no provider before it knows the breakers; then both loops run until ``stop``.
    """

    mundane_level = "debug"  # mode's "Starting..."/"Stopping..." lines: the worker's log reads as before

    def __init__(
        self,
        circuits: Circuits,
        *,
        bootstrap: str,
        client_kwargs: dict[str, Any] | None = None,
        history_s: float = 600.0,
        timeout: float = 60.0,
        clock: Callable[[], float] = time.time,
        **kwargs: Any,
    ) -> None:
        self.circuits = circuits
        self.bootstrap = bootstrap
        self.client_kwargs = client_kwargs or {}  # broker credentials (agents_stream.kafka.security)
        self.history_s = history_s
        self.timeout = timeout
        self._clock = clock
        self._tp = TopicPartition(topics.CIRCUITS, 0)
        self._consumer: AIOKafkaConsumer | None = None
        super().__init__(**kwargs)

    async def on_start(self) -> None:
        """Fold the recent log (``history_s``) up to its current end; the loops start after."""
        timeout, tp = self.timeout, self._tp
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            fetch_max_wait_ms=20,  # the fold's propagation delay: keep it short
            client_id=f"circuits-{self.circuits.worker_id}",
            **self.client_kwargs,
        )
        await asyncio.wait_for(consumer.start(), timeout)
        self._consumer = consumer
        partitions = consumer.partitions_for_topic(topics.CIRCUITS)
        if partitions is not None and len(partitions) != 1:
            raise RuntimeError(
                f"{topics.CIRCUITS} has {len(partitions)} partitions; the circuits need exactly one "
                "(one order for every worker): delete the topic and let a worker create it"
            )
        consumer.assign([tp])
        since = int((self._clock() - self.history_s) * 1000)
        found = await asyncio.wait_for(consumer.offsets_for_times({tp: since}), timeout)
        end = (await asyncio.wait_for(consumer.end_offsets([tp]), timeout))[tp]
        start_offset = found[tp].offset if found.get(tp) is not None else end
        self.circuits.begin(start_offset)
        consumer.seek(tp, start_offset)
        deadline = time.monotonic() + timeout
        while await asyncio.wait_for(consumer.position(tp), timeout) < end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topics.CIRCUITS} up to offset {end} within {timeout:.0f}s")
            self._fold(await consumer.getmany(tp, timeout_ms=500, max_records=5000))
        log.info(
            "Circuits: folded %d events of %s (offsets %d..%d); providers %s",
            self.circuits.folded, topics.CIRCUITS, start_offset, end, ", ".join(self.circuits.providers()),
        )

    async def on_shutdown(self) -> None:
        """After the loops ended (mode cancels and awaits them first): close the consumer."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                await asyncio.wait_for(consumer.stop(), timeout=5.0)
            except Exception as exc:  # best effort on the way out
                log.warning("Circuits consumer did not stop cleanly: %r", exc)

    def _fold(self, batch: dict[TopicPartition, list[Any]]) -> None:
        self.circuits.fold(itertools.chain.from_iterable(batch.values()))

    @Service.task
    async def _follow(self) -> None:
        consumer = self._consumer
        assert consumer is not None  # on_start set it; tasks start after it
        while not self.should_stop:
            try:
                batch = await consumer.getmany(self._tp, timeout_ms=500, max_records=1000)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # aiokafka reconnects by itself; keep following
                log.warning("Circuits: reading %s failed (%r); retrying in 1s", topics.CIRCUITS, exc)
                await self.sleep(1.0)
                continue
            try:
                self._fold(batch)
            except Exception as exc:  # fold skips bad records; this is a bug, and the fold must go on
                log.exception("Circuits: folding a batch failed (%r); continuing with the next", exc)

    @Service.task
    async def _hello(self) -> None:
        while not self.should_stop:
            try:
                self.circuits.hello()
            except Exception as exc:  # presence is refreshed next round
                log.warning("Circuits: presence not sent (%r)", exc)
            await self.sleep(self.circuits.presence_s)

    @Service.task
    async def _report(self) -> None:
        while not self.should_stop:
            await self.sleep(self.circuits.report_s)
            try:
                self.circuits.report_successes()
            except Exception as exc:  # the count stays with the next report or failure
                log.warning("Circuits: success counts not sent (%r); they go with the next report", exc)
