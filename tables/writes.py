"""A table's writes waiting for their flush: the last value per key, and the future its changelog send settles.

The ledger writes a table many times per loop iteration (a lease, a finished record, a spend entry, a timer).
Each write is staged here instead of being sent at once; the table's flush (``LedgerTable.flush``) then sends one
changelog record per key, with the key's last value, and writes one RocksDB batch per partition. Whoever waits
for a write (the outbox, holding an offset) waits on the key's ``Staged.sent``, which the flush chains to the
broker's answer for the record that carries the key's final value. A later value supersedes an earlier one: a
compacted changelog keeps only the last anyway, and nothing waits on the earlier value alone.

The local store is written before the broker answers, so it can hold writes the changelog never got (the worker
killed in between). ``Unconfirmed`` keeps, per partition, the local writes whose changelog record the broker has
not confirmed yet: while there are any, the partition's persisted changelog offset is absent from its store, and a
store found with data but no persisted offset when a worker opens it is discarded and recovered from the
changelog (``LedgerTable.persisted_offset``; docs/decisions.md, "Only confirmed writes survive a restart").
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterator

import orjson
from faust.streams import current_event

__all__ = [
    "DELETED", "FAULT_UNANSWERED_CHANGELOG", "Staged", "Unconfirmed", "WriteBuffer", "chain", "current_partition",
    "key_bytes", "unanswered", "value_bytes", "writing",
]

log = logging.getLogger(__name__)

#: the partition a table write goes to when no Faust event is being handled (``writing``)
_partition: ContextVar[int | None] = ContextVar("agents_stream_table_partition", default=None)


@contextmanager
def writing(partition: int) -> Iterator[None]:
    """Table reads and writes in this block are of ``partition``: for the ledger applying an outcome of its own
    executor between two events, where Faust has no current event to take the partition from."""
    token = _partition.set(partition)
    try:
        yield
    finally:
        _partition.reset(token)


def value_bytes(value: Any) -> bytes:
    """A value's JSON: orjson's, or the standard module's for what orjson refuses (an integer past 64 bits, which a
    task's context or a model's answer may hold: refusing it would stop the worker on the task's data)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":")).encode()


def key_bytes(key: str) -> bytes:
    # What Faust's json key serializer makes of a str without orjson (ASCII, escaped): the keys already in every
    # deployed store and changelog. Faust switches to orjson (raw UTF-8) when it is importable, so the keys are
    # encoded here, the same way whatever is installed.
    return json.dumps(key).encode()



def current_partition() -> int | None:
    """The partition a table read or write is of: ``writing``'s, else the Faust event being handled's."""
    partition = _partition.get()
    if partition is not None:
        return partition
    event = current_event()
    return None if event is None else event.message.partition


#: Fault injection for tests: ``<table>=<text>`` — a changelog record of that table whose value contains the text
#: is never sent, and its send never settles (the broker never answers). Unset (always, in production): inert.
FAULT_UNANSWERED_CHANGELOG = "AGENTS_STREAM_FAULT_UNANSWERED_CHANGELOG"


class _Deleted:
    """The value of a staged delete (a tombstone in the changelog)."""

    def __repr__(self) -> str:
        return "DELETED"


DELETED: Any = _Deleted()


@dataclass
class Staged:
    """One key's pending write: its partition, its last value (``DELETED`` for a delete) and the future that
    settles with the broker's answer for the changelog record that carries it."""

    partition: int
    value: Any
    sent: "asyncio.Future[Any]"


class WriteBuffer:
    """The staged writes of one table, by key, in the order their keys were first written."""

    def __init__(self) -> None:
        self._staged: dict[str, Staged] = {}

    def __len__(self) -> int:
        return len(self._staged)

    def stage(self, partition: int, key: str, value: Any) -> "asyncio.Future[Any]":
        """Stage ``value`` (or ``DELETED``) for ``key``; the future settles when the record carrying it is sent.

        A key written again before the flush keeps its future: the one record sent answers both writes."""
        staged = self._staged.get(key)
        if staged is None:
            staged = self._staged[key] = Staged(partition, value, asyncio.get_running_loop().create_future())
        else:
            if staged.partition != partition:  # a key lives in one partition (docs/faust.md, "Tables")
                raise ValueError(f"table key {key!r} written to partition {partition}, staged in {staged.partition}")
            staged.value = value
        return staged.sent

    def lookup(self, key: str) -> Staged | None:
        """The key's staged write, if it has one (a read sees it before the flush does)."""
        return self._staged.get(key)

    def take(self) -> list[tuple[str, Staged]]:
        """Every staged write, in order, and an empty buffer."""
        staged = list(self._staged.items())
        self._staged.clear()
        return staged


def chain(source: "asyncio.Future[Any]", target: "asyncio.Future[Any]") -> None:
    """Settle ``target`` as ``source`` settles (its result, its exception, or cancelled)."""

    def settle(done: "asyncio.Future[Any]") -> None:
        if target.done():
            return
        if done.cancelled():
            target.cancel()
        elif done.exception() is not None:
            target.set_exception(done.exception())  # type: ignore[arg-type]
        else:
            target.set_result(done.result())

    if source.done():
        settle(source)
    else:
        source.add_done_callback(settle)


class Unconfirmed:
    """Per partition, the local writes whose changelog record the broker has not confirmed yet (key → the value
    written, None for a delete), and the highest changelog offset confirmed so far."""

    def __init__(self) -> None:
        self._writes: dict[int, dict[bytes, bytes | None]] = {}
        self._confirmed: dict[int, int] = {}

    def __contains__(self, partition: object) -> bool:
        return bool(self._writes.get(partition))  # type: ignore[call-overload]

    def partitions(self) -> list[int]:
        """The partitions with local writes not yet confirmed."""
        return [partition for partition, writes in self._writes.items() if writes]

    def forget(self, partition: int) -> None:
        """``partition``'s store was discarded: nothing of it waits for the broker any more."""
        self._writes.pop(partition, None)
        self._confirmed.pop(partition, None)

    def wrote(self, partition: int, key: bytes, value: bytes | None) -> None:
        """``key`` was written to ``partition``'s local store, its changelog record not yet confirmed."""
        self._writes.setdefault(partition, {})[key] = value

    def confirmed(self, partition: int, key: bytes, value: bytes | None, offset: int) -> int | None:
        """The broker confirmed the changelog record ``key`` → ``value`` at ``offset``: the offset to persist once
        every local write of the partition is confirmed, else None (a later write of the key is still open)."""
        self._confirmed[partition] = max(offset, self._confirmed.get(partition, offset))
        writes = self._writes.get(partition)
        if writes is not None and key in writes and writes[key] == value:
            del writes[key]
        if writes:
            return None
        self._writes.pop(partition, None)
        return self._confirmed[partition]


def unanswered(table: str) -> bytes | None:
    """The text of ``FAULT_UNANSWERED_CHANGELOG`` for ``table`` (a test fault), None when it is not set for it."""
    name, _, text = os.environ.get(FAULT_UNANSWERED_CHANGELOG, "").partition("=")
    if not text or name.strip() != table:
        return None
    log.warning(
        "%s is set: changelog records of table %s containing %r are never sent (a test fault; never set it in "
        "production)", FAULT_UNANSWERED_CHANGELOG, table, text,
    )
    return text.encode()
