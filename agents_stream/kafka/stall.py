"""Which assigned partitions have records waiting while the ledger's read position stands still.

Pure bookkeeping, no I/O. Faust's fetcher can drop records it has already
fetched (a batch cut short by a rebalance, a partition left out of the active
set): aiokafka's position has moved past them, so nothing fetches them again,
and the partition stalls with lag while nothing is lost (the watermark never
commits past them). The runtime feeds ``observe`` with each partition's next
unhandled offset and its end offset; a partition that has had records waiting
for ``after_s`` without its position moving is reported once, and reported
again only after another ``after_s`` without progress.

Right after a rebalance the wait is shorter (``fresh_after_s``): a partition whose reading was just sought to the
group's commit normally delivers its first waiting record within milliseconds, and one that Faust's fetcher
skipped there would otherwise hold the tasks on it — among them a dead worker's, to be taken over at once — for
the whole ``after_s``. It lasts until the partition's position first moves.
"""

from __future__ import annotations

from typing import Hashable, Iterable, NamedTuple

#: the wait of a partition whose position has not moved since the rebalance that assigned it (see the module). A
#: fetch that finds nothing is held 100 ms (kafka/consumer.py, FETCH_MAX_WAIT_MS), so a partition that has records
#: delivers its first one well within this; one read again too early is only read twice (the ledger's redelivery).
FRESH_AFTER_S = 1.0


class Stall(NamedTuple):
    """A partition whose position stood still with records waiting: for ``still`` seconds; ``fresh`` when it has
    not moved since the rebalance that assigned it (Faust's fetcher dropped what it fetched during the recovery)."""

    still: float
    fresh: bool


class StallDetector:
    def __init__(self, after_s: float, fresh_after_s: float = FRESH_AFTER_S) -> None:
        self.after_s = after_s
        self.fresh_after_s = min(after_s, fresh_after_s)
        self._since: dict[Hashable, tuple[int, float]] = {}
        self._fresh: set[Hashable] = set()  # assigned by the last rebalance, position not moved since

    def restart_at(self, positions: dict[Hashable, int | None], now: float) -> None:
        """A rebalance ended: reading starts at ``positions`` (the group's commits) on these partitions now."""
        for tp, position in positions.items():
            if position is None:
                continue
            self._since[tp] = (position, now)
            self._fresh.add(tp)

    def observe(self, tp: Hashable, position: int, end: int, now: float) -> Stall | None:
        """When ``tp`` has had records at or past ``position`` for ``after_s`` (``fresh_after_s`` right after a
        rebalance) and ``position`` has not moved: how long it stood still, and whether right after a rebalance."""
        if end <= position:
            self._since.pop(tp, None)
            self._fresh.discard(tp)
            return None
        seen = self._since.get(tp)
        if seen is None or seen[0] != position:
            self._since[tp] = (position, now)
            if seen is not None:
                self._fresh.discard(tp)
            return None
        still, fresh = now - seen[1], tp in self._fresh
        if still < (self.fresh_after_s if fresh else self.after_s):
            return None
        self._since[tp] = (position, now)  # the re-read gets a full period before the next report
        self._fresh.discard(tp)
        return Stall(still, fresh)

    def fresh(self, among: Iterable[Hashable]) -> bool:
        """Some partition of ``among`` has not moved since the rebalance that assigned it (its shorter wait applies).
        A partition paused since stays fresh until it is watched again: it asks for no look meanwhile."""
        return not self._fresh.isdisjoint(among)

    def forget(self, tps: Iterable[Hashable]) -> None:
        for tp in tps:
            self._since.pop(tp, None)
            self._fresh.discard(tp)

    def clear(self) -> None:
        self._since.clear()
        self._fresh.clear()
