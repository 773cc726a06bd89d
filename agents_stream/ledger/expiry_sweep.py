"""Finished task records expire: a sweep finds, a slice at a time, the task-table entries of this worker's
partitions that outlived their time to live, and the ledger tombstones them when their event comes back.

The sweep runs on a timer and only reads (``LedgerTable.scan``); what it finds goes out as a ``RecordsExpired``
event on this app's outcomes topic, on the entries' partition, so the delete is done by the ledger while it handles
that event — the table's one writer, with the tombstone held in the watermark like any write. The ledger checks
each entry again (``tables/expiry.expired``): one that changed since (a requeue) stays.

The time to live is set at start: ``AGENTS_STREAM_RECORD_TTL_S``, never less than the longest retention of
the task topics this worker reads (0, the default, means that retention). A topic kept forever keeps its records
forever.

Past its time to live an entry is still kept while its task message can be read (tables/expiry.py): before each
sweep the worker asks the broker for the log start offsets (ListOffsets earliest) of the task topic partitions the
entries found past their time to live point at (``refresh``), and an entry goes once its message's offset is below
its partition's log start. A log start only grows, so one read a sweep ago is a safe answer at the ledger too.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from faust.types import TP

from agents_stream.kafka.outbox import Outbox, Send
from agents_stream.settings import Settings
from agents_stream.tables.definitions import ScannedTable
from agents_stream.tables.expiry import expired, past_ttl, source

__all__ = ["Expiry"]

log = logging.getLogger(__name__)


class Expiry:
    def __init__(self, settings: Settings, table: ScannedTable, outbox: Outbox) -> None:
        self.settings = settings
        self.table = table
        self.outbox = outbox
        #: seconds a finished record is kept; None until set at start (nothing expires before), inf: never
        self.ttl: float | None = None
        #: where each partition's sweep goes on from (the last key it looked at)
        self._cursors: dict[int, bytes | None] = {}
        #: entries expired here since start (for the log and tests)
        self.expired = 0
        #: the broker's log start offset of each task topic partition an entry past its time to live points at
        self.log_starts: dict[tuple[str, int], int] = {}
        #: the task topic partitions whose log start the next ``refresh`` asks for
        self._asked: set[TP] = set()

    def set_ttl(self, retention_s: float | None) -> float:
        """The time to live, from the setting and the task topics' longest retention (None: kept forever)."""
        wanted = self.settings.record_ttl_s
        if wanted < 0 or retention_s is None:
            self.ttl = math.inf
            why = "AGENTS_STREAM_RECORD_TTL_S < 0" if wanted < 0 else "a task topic keeps its records forever"
            log.info("Finished task records never expire (%s)", why)
            return self.ttl
        self.ttl = max(wanted, retention_s)
        if 0 < wanted < retention_s:
            log.warning(
                "AGENTS_STREAM_RECORD_TTL_S=%.0f is shorter than the task topics' retention (%.0f s): finished records "
                "are kept for the retention instead, so a task still in its topic always finds its record",
                wanted, retention_s,
            )
        log.info("Finished task records expire %.0f s after they finish", self.ttl)
        return self.ttl

    def keep(self, partitions: set[int]) -> None:
        """Only ``partitions`` are this worker's now: the places of the others are forgotten."""
        for gone in set(self._cursors) - partitions:
            del self._cursors[gone]
        self._asked = {tp for tp in self._asked if tp.partition in partitions}
        self.log_starts = {at: start for at, start in self.log_starts.items() if at[1] in partitions}

    async def refresh(self, earliest: Callable[..., Awaitable[Mapping[TP, int]]], timeout: float = 10.0) -> None:
        """Ask the broker (``earliest``: the consumer's ListOffsets earliest) for the log start offsets of the task
        topic partitions the last sweeps found entries past their time to live on. Unanswered, the entries stay."""
        if not self._asked:
            return
        try:
            starts = await asyncio.wait_for(earliest(*sorted(self._asked)), timeout=timeout)
        except Exception as exc:  # a broker that does not answer keeps every record (the safe side)
            log.warning(
                "Could not read the log start offsets of %d task topic partitions (%r): finished records whose task "
                "message may still be in its topic are kept; the next sweep asks again", len(self._asked), exc,
            )
            return
        for tp, start in starts.items():
            if isinstance(start, int):
                self.log_starts[(tp.topic, tp.partition)] = start

    def sweep_one(self, partition: int, now: float) -> list[str]:
        """The next ``AGENTS_STREAM_EXPIRY_BATCH`` entries of one partition: the expired keys among them. A slice at
        a time, so the worker's loop is held for one slice only (the timer yields between partitions)."""
        ttl = self.ttl
        if ttl is None or math.isinf(ttl):
            return []
        entries, self._cursors[partition] = self.table.scan(
            partition, self._cursors.get(partition), self.settings.expiry_batch,
        )
        found = []
        for key, value in entries:
            if expired(key, value, now=now, ttl=ttl, partition=partition, log_starts=self.log_starts):
                found.append(key)
            elif past_ttl(key, value, now=now, ttl=ttl) and (message := source(key, value, partition)) is not None:
                self._asked.add(TP(message[0], message[1]))  # its message may still be readable: ask the broker
        return found

    def apply(self, tp: TP, keys: list[str], now: float) -> list[Send]:
        """The ledger handles a ``RecordsExpired`` event: each entry still expired is deleted; the tombstones' sends."""
        ttl = self.ttl
        if ttl is None or math.isinf(ttl):
            return []
        sends: list[Send] = []
        for key in keys:
            value: Any = self.table.get(key)
            if value is not None and expired(
                key, value, now=now, ttl=ttl, partition=tp.partition, log_starts=self.log_starts,
            ):
                del self.table[key]
                sends.append(self.outbox.changelog(self.table, tp.partition, key))
        self.expired += len(sends)
        if sends:
            log.debug("Expired %d finished task records of partition %d (%d in all)", len(sends), tp.partition,
                      self.expired)
        return sends
