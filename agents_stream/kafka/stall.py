"""Which assigned partitions have records waiting while the ledger's read position stands still.

Pure bookkeeping, no I/O. Faust's fetcher can drop records it has already
fetched (a batch cut short by a rebalance, a partition left out of the active
set): aiokafka's position has moved past them, so nothing fetches them again,
and the partition stalls with lag while nothing is lost (the watermark never
commits past them). The runtime feeds ``observe`` with each partition's next
unhandled offset and its end offset; a partition that has had records waiting
for ``after_s`` without its position moving is reported once, and reported
again only after another ``after_s`` without progress.
"""

from __future__ import annotations

from typing import Hashable, Iterable


class StallDetector:
    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self._since: dict[Hashable, tuple[int, float]] = {}

    def observe(self, tp: Hashable, position: int, end: int, now: float) -> bool:
        """True when ``tp`` has had records at or past ``position`` for ``after_s`` and ``position`` has not moved."""
        if end <= position:
            self._since.pop(tp, None)
            return False
        seen = self._since.get(tp)
        if seen is None or seen[0] != position:
            self._since[tp] = (position, now)
            return False
        if now - seen[1] < self.after_s:
            return False
        self._since[tp] = (position, now)  # the re-read gets a full period before the next report
        return True

    def forget(self, tps: Iterable[Hashable]) -> None:
        for tp in tps:
            self._since.pop(tp, None)

    def clear(self) -> None:
        self._since.clear()
