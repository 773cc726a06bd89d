"""The commit watermark: per partition, the lowest offset whose outcome is not yet durable.

Pure bookkeeping, no I/O. The ledger marks each message it has handled
(``handled``) and keeps an offset open (``open``) for as long as something
that message started is not durable — a dispatched task without a terminal
outcome, a dead-letter or result send the broker has not confirmed. What the
consumer commits for a partition is ``commit_offset``: never past an open
offset, never past a message the ledger has not seen (docs/faust.md: Faust
acks events it dropped on a rebalance, and its own bookkeeping commits past
un-acked messages).
"""

from __future__ import annotations

from collections import Counter
from typing import Hashable, Iterable


class Watermark:
    def __init__(self) -> None:
        self._open: dict[Hashable, Counter[int]] = {}
        self._next: dict[Hashable, int] = {}
        #: bumped each time ``tp`` is forgotten: a hold taken before a revoke is not released by mistake
        #: from the holds taken after the same partition came back
        self._generation: dict[Hashable, int] = {}

    def open(self, tp: Hashable, offset: int) -> int:
        """Hold ``offset`` of ``tp``: nothing at or after it is committed until ``close``.
        Returns the hold's generation, to give back to ``close``."""
        self._open.setdefault(tp, Counter())[offset] += 1
        return self._generation.get(tp, 0)

    def close(self, tp: Hashable, offset: int, generation: int) -> None:
        """Release one hold of ``offset`` taken in ``generation`` (holds are counted: open twice, close twice)."""
        if generation != self._generation.get(tp, 0):
            return  # taken before the partition was revoked: forget() dropped it, the holds now are newer ones
        held = self._open.get(tp)
        if not held or offset not in held:
            return
        held[offset] -= 1
        if held[offset] <= 0:
            del held[offset]

    def generation(self, tp: Hashable) -> int:
        """How many times ``tp`` was forgotten (revoked): a hold, or anything else, of an older one is stale."""
        return self._generation.get(tp, 0)

    def start(self, tp: Hashable, offset: int) -> None:
        """``tp`` was assigned and reading starts at ``offset`` (the group's commit): a first record
        handled past it is a gap, not a new start (records the consumer dropped after a rebalance)."""
        self._next.setdefault(tp, offset)

    def skip_to(self, tp: Hashable, offset: int) -> None:
        """The records before ``offset`` no longer exist (deleted by retention): expect ``offset`` next."""
        if self._next.get(tp, offset) < offset:
            self._next[tp] = offset

    def gap(self, tp: Hashable, offset: int) -> int | None:
        """The first offset never handled when ``offset`` would jump past it (see ``handled``), else None."""
        expected = self._next.get(tp)
        return expected if expected is not None and offset > expected else None

    def handled(self, tp: Hashable, offset: int) -> int | None:
        """The ledger is done with ``offset`` (its effects are durable or held open).

        Returns the first skipped offset when ``offset`` jumps past messages never
        handled (our topics have no compaction or transactions, so a gap means the
        consumer dropped records). The position then stays at that offset: nothing
        past it is committed, and the caller reads the partition again from there
        (records handled twice are redeliveries to the ledger).
        """
        gap = self.gap(tp, offset)
        if gap is not None:
            return gap
        if offset + 1 > self._next.get(tp, -1):
            self._next[tp] = offset + 1
        return None

    def commit_offset(self, tp: Hashable) -> int | None:
        """The offset to commit for ``tp`` (Kafka's "next to read"), or None if nothing is known."""
        held = self._open.get(tp)
        if held:
            return min(held)
        return self._next.get(tp)

    def next_offset(self, tp: Hashable) -> int | None:
        """The offset after the last one handled on ``tp`` since it was assigned, or None."""
        return self._next.get(tp)

    def open_count(self, tp: Hashable | None = None) -> int:
        if tp is not None:
            return sum(self._open.get(tp, Counter()).values())
        return sum(sum(c.values()) for c in self._open.values())

    def forget(self, tps: Iterable[Hashable]) -> None:
        """Partitions revoked: their holds belong to the next owner, who restarts at the commit."""
        for tp in tps:
            self._open.pop(tp, None)
            self._next.pop(tp, None)
            self._generation[tp] = self._generation.get(tp, 0) + 1

    def tracked(self) -> set[Hashable]:
        return set(self._next) | set(self._open)
