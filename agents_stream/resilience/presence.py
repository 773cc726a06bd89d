"""Who is alive and what they spent, folded from the circuits log's presence events: bounded by age and count (pure).

A presence (``hello``) names a worker, the endpoints it calls and its partitions' spend of the day. Anyone who can
write ``agent.circuits`` can invent workers and days, so nothing here grows with what the log says: a worker not
heard from within ``horizon_s`` is dropped, at most ``MAX_WORKERS`` are kept, spend is kept for today and
yesterday only (``SPEND_DAYS``), at most ``MAX_SPEND_ENTRIES`` reports, and a report that is no finite, non-negative
amount is ignored. docs/decisions.md, "Internal topics cannot stall a partition".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Iterable, Mapping

__all__ = ["MAX_SPEND_ENTRIES", "MAX_WORKERS", "SPEND_DAYS", "Cadence", "Presence"]


@dataclass(frozen=True)
class Cadence:
    """How often a worker writes its own records to the circuits log: its presence and spend (``presence_s``; a
    worker silent for three of them is gone), and its calls' successes (``report_s``)."""

    presence_s: float = 5.0
    report_s: float = 1.0

#: workers whose presence is kept (the most recently heard); a real cluster has a few dozen
MAX_WORKERS = 1000
#: (app, agent, day, partition) spend reports kept (the most recent)
MAX_SPEND_ENTRIES = 20_000
#: spend is kept for the UTC days this many days back from today (0 = today): a daily budget reads today's only
SPEND_DAYS = 2


def _days(now: float) -> frozenset[str]:
    today = datetime.fromtimestamp(now, UTC)
    return frozenset((today - timedelta(days=back)).strftime("%Y-%m-%d") for back in range(SPEND_DAYS))


class Presence:
    """Workers' last presence and their spend reports; ``horizon_s`` is how long a presence counts."""

    def __init__(self, horizon_s: float) -> None:
        self.horizon_s = horizon_s
        #: worker id → (last hello at, endpoints it calls)
        self.workers: dict[str, tuple[float, frozenset[str]]] = {}
        #: (app id, agent, day, partition) → (reported at, USD): the newest report per partition wins
        self.spent: dict[tuple[str, str, str, str], tuple[float, float]] = {}
        self._pruned_at = float("-inf")

    def hello(
        self, worker: str, at: float, endpoints: Iterable[str], app: str,
        spend: Mapping[str, Mapping[str, Mapping[str, float]]], now: float,
    ) -> None:
        """Fold one presence at ``at`` (never later than ``now``: a clock ahead cannot keep a worker alive)."""
        at = min(at, now)
        self.workers.pop(worker, None)  # re-inserted last: the dict stays ordered by last hello
        self.workers[worker] = (at, frozenset(endpoints))
        days = _days(now)
        for agent, by_day in spend.items():
            for day, parts in by_day.items():
                if day not in days:
                    continue
                for partition, usd in parts.items():
                    if not (math.isfinite(usd) and usd >= 0):
                        continue
                    key = (app, str(agent), str(day), str(partition))
                    if key not in self.spent or self.spent[key][0] <= at:
                        self.spent.pop(key, None)
                        self.spent[key] = (at, float(usd))
        self.prune(now)

    def prune(self, now: float) -> None:
        """Drop workers gone quiet and spend of other days (at most once a second), and the oldest entries past
        the caps (at once)."""
        if now - self._pruned_at >= 1.0:
            self._pruned_at = now
            horizon = now - self.horizon_s
            self.workers = {w: seen for w, seen in self.workers.items() if seen[0] >= horizon}
            days = _days(now)
            self.spent = {k: v for k, v in self.spent.items() if k[2] in days}
        while len(self.workers) > MAX_WORKERS:
            del self.workers[next(iter(self.workers))]  # insertion order: the least recently heard first
        while len(self.spent) > MAX_SPEND_ENTRIES:
            del self.spent[next(iter(self.spent))]

    def live(self, endpoint: str, me: str, now: float) -> int:
        """Workers (``me`` included) heard within the horizon that call ``endpoint``."""
        horizon = now - self.horizon_s
        return 1 + sum(1 for w, (at, ids) in self.workers.items() if w != me and at >= horizon and endpoint in ids)

    def spend(self, app: str, agent: str, day: str) -> float:
        """The sum of the latest reports of ``app``'s agent on ``day``."""
        mine = (app, agent, day)
        return sum(usd for (a, ag, d, _), (_, usd) in self.spent.items() if (a, ag, d) == mine)
