"""A table's writes waiting for their flush: the last value per key, and the future its changelog send settles.

The ledger writes a table many times per loop iteration (a lease, a finished record, a spend entry, a timer).
Each write is staged here instead of being sent at once; the table's flush (``LedgerTable.flush``) then sends one
changelog record per key, with the key's last value, and writes one RocksDB batch per partition. Whoever waits
for a write (the outbox, holding an offset) waits on the key's ``Staged.sent``, which the flush chains to the
broker's answer for the record that carries the key's final value. A later value supersedes an earlier one: a
compacted changelog keeps only the last anyway, and nothing waits on the earlier value alone.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

__all__ = ["DELETED", "Staged", "WriteBuffer", "chain"]


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
            if staged.partition != partition:  # a key lives in one partition (FAUST-NOTES.md "Tables")
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
