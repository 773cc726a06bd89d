"""Who calls which endpoint, and what each app's agents spent: the presence (``hello``) events of the circuits log."""

from __future__ import annotations

from agents_stream.contract.events import CircuitHello

__all__ = ["Presence"]


class Presence:
    """The latest ``hello`` of every worker, and the newest spend report of every partition, folded in log order."""

    def __init__(self) -> None:
        #: worker id → (last hello at, endpoints it calls)
        self._seen: dict[str, tuple[float, frozenset[str]]] = {}
        #: (app id, agent, day, partition) → (reported at, USD): the newest report per partition wins
        self._spend: dict[tuple[str, str, str, str], tuple[float, float]] = {}

    def fold(self, at: float, ev: CircuitHello) -> None:
        """Apply one hello at ``at``; absent (None) fields are no endpoints, app "" and no spend."""
        self._seen[ev.worker] = (at, frozenset(ev.providers or ()))
        app = ev.app or ""
        for agent, days in (ev.spend or {}).items():
            for day, parts in days.items():
                for partition, usd in parts.items():
                    key = (app, str(agent), str(day), str(partition))
                    if key not in self._spend or self._spend[key][0] <= at:
                        self._spend[key] = (at, float(usd))

    def others(self, circuit: str, worker_id: str, since: float) -> int:
        """Workers other than ``worker_id`` that said at or after ``since`` that they call ``circuit``."""
        return sum(1 for w, (at, ids) in self._seen.items() if w != worker_id and at >= since and circuit in ids)

    def spend(self, app: str, agent: str, day: str) -> float:
        """Cluster-wide spend of ``app``'s agent on a UTC day, as the workers last reported it."""
        mine = (app, agent, day)
        return sum(usd for (a, g, d, _), (_, usd) in self._spend.items() if (a, g, d) == mine)
