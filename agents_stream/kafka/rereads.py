"""The partitions being read again from an offset, and the records passed over until that offset arrives.

Pure bookkeeping, no I/O: the consumer (``kafka/consumer.py``) asks it about each record it fetched.
"""

from __future__ import annotations

from typing import Iterable

from faust.types import TP

#: how long a re-read passes over the records fetched before its seek, waiting for the record at its start (it comes
#: within a fetch wait, 100 ms, unless it was dropped again): then they are delivered, the ledger sees the gap again,
#: and its next re-read comes as before (``Flow.reread``)
PASS_OVER_S = 1.0


class Rereads:
    """The partitions being read again from an offset (a gap's or a stall's re-read, ``kafka/flow.py``), and the
    records passed over until that offset arrives.

    The seek lands while Faust's delivery loop may be part-way through a batch fetched before it. Faust raises its
    read offset of a partition with every record it delivers and drops any later record below it as already read,
    so the rest of that batch (past the re-read's start) would raise it past the gap again, and the re-read's own
    records would be dropped: the gap stayed until the next re-read, seconds later. From the seek until the record
    at its start arrives (for ``PASS_OVER_S`` at most), a record of that partition past the start is passed over (not
    delivered). Nothing is lost by it: the ledger would not apply such a record (it lies past the gap), and it is
    fetched again after the start, in order. Pure bookkeeping, no I/O: the caller gives the time.
    """

    def __init__(self) -> None:
        self._start: dict[TP, tuple[int, float]] = {}  # partition → (start, passing over until: monotonic)

    def __bool__(self) -> bool:
        return bool(self._start)

    def start(self, tp: TP, offset: int, now: float) -> None:
        self._start[tp] = (offset, now + PASS_OVER_S)

    def cancel(self, tps: Iterable[TP]) -> None:
        """No re-read of ``tps`` is under way any more (its seek failed, or a rebalance seeks them anew)."""
        for tp in tps:
            self._start.pop(tp, None)

    def clear(self) -> None:
        """A rebalance seeks every assigned partition to the group's commit: no re-read is under way after it."""
        self._start.clear()

    def passes_over(self, tp: TP, offset: int, now: float) -> bool:
        """Whether the record at ``offset`` of ``tp`` was fetched before the seek of a re-read (past its start,
        before the start arrived): not to be delivered. The record at the start ends the re-read, and so does
        ``PASS_OVER_S`` without it (it was dropped again: the ledger's next re-read is the way on)."""
        found = self._start.get(tp)
        if found is None:
            return False
        start, until = found
        if offset == start or now > until:
            del self._start[tp]
            return False
        return offset > start
