"""The console's charts: a bounded ring of one worker's own samples, and the samples of every worker merged (pure).

Each worker samples what it already keeps in memory (tasks ended, consumer lag, provider calls in flight, held
tasks, breaker states) every ``AGENTS_STREAM_CONSOLE_SAMPLE_S`` and keeps ``AGENTS_STREAM_CONSOLE_HISTORY_S`` of
them; ``GET /samples`` gathers the rings of all workers and lines them up on one time grid (``merge``). Nothing is
stored anywhere else: a worker that restarts starts a new ring, one that stopped takes its samples with it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

__all__ = ["BREAKER_ORDER", "Sample", "SampleRing", "merge", "rates"]

#: breaker states from best to worst; merged workers show the worst any of them saw at a time
BREAKER_ORDER = ("closed", "half_open", "open")


@dataclass(frozen=True)
class Sample:
    """What one worker saw at one moment."""

    at: float  # epoch seconds: workers' samples are lined up by the wall clock
    ended: float  # tasks this worker's ledger saw end since it started (agents_stream_tasks_total, summed)
    lag: int  # records not yet done on this worker's partitions of the task topics
    in_flight: int  # provider calls this worker has started and not yet seen end
    held: int  # tasks held here because no provider they may use is available
    breakers: dict[str, str] = field(default_factory=dict)  # circuit name → state

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Sample:
        """A sample as another worker sent it; ValueError/TypeError/KeyError when it is not one."""
        breakers = data.get("breakers") or {}
        if not isinstance(breakers, dict):
            raise TypeError("breakers is not an object")
        return cls(
            at=float(data["at"]), ended=float(data["ended"]), lag=int(data["lag"]), in_flight=int(data["in_flight"]),
            held=int(data["held"]), breakers={str(k): str(v) for k, v in breakers.items()},
        )


class SampleRing:
    """The last ``history_s`` of one worker's samples, one every ``interval_s`` (older ones fall out)."""

    def __init__(self, interval_s: float, history_s: float) -> None:
        if interval_s <= 0 or history_s < interval_s:
            raise ValueError(f"need 0 < interval ({interval_s}) <= history ({history_s})")
        self.interval_s = interval_s
        self.history_s = history_s
        self._samples: deque[Sample] = deque(maxlen=math.ceil(history_s / interval_s) + 1)

    def add(self, sample: Sample) -> None:
        # A clock stepped back: the older samples would read as the future; the ring starts again from here.
        if self._samples and sample.at <= self._samples[-1].at:
            self._samples.clear()
        self._samples.append(sample)

    def samples(self) -> list[Sample]:
        return list(self._samples)

    def to_json(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in self._samples]


def rates(samples: list[Sample]) -> list[float | None]:
    """Tasks ended per second between each sample and the one before it (None for the first: no interval yet)."""
    out: list[float | None] = []
    for before, now in zip([None, *samples], samples, strict=False):
        if before is None or now.at <= before.at:
            out.append(None)
        else:  # a counter never goes down within one process; a ring starts again if the clock steps back
            out.append(max(now.ended - before.ended, 0.0) / (now.at - before.at))
    return out


def _worst(states: Iterable[str]) -> str | None:
    known = [s for s in states if s in BREAKER_ORDER]
    others = [s for s in states if s not in BREAKER_ORDER]
    if known:
        return max(known, key=BREAKER_ORDER.index)
    return others[0] if others else None


def merge(shares: Iterable[list[Sample]], interval_s: float, history_s: float, now: float) -> dict[str, Any]:
    """The samples of every worker on one grid of ``interval_s`` steps over the last ``history_s`` before ``now``.

    At each grid time a worker counts with its latest sample at or before it, if that is less than two steps old
    (a late timer tick still counts; a worker that stopped sampling does not). Throughput, lag, calls in flight
    and held tasks are sums over the workers counted; a breaker shows the worst state any of them saw. A time no
    worker counts at is None (a gap in the line). ``workers`` is how many counted.
    """
    step = interval_s
    stale = 2 * step
    start = math.floor((now - history_s) / step) + 1
    ticks = [k * step for k in range(start, math.floor(now / step) + 1)]
    # the grid ends at the last whole step; a sample newer than it still shows: the last point is "now"
    if not ticks or ticks[-1] < now:
        ticks.append(now)
    per_worker = [(s, rates(s)) for s in (sorted(share, key=lambda x: x.at) for share in shares) if s]
    out: dict[str, list[Any]] = {k: [] for k in ("t", "ended_per_s", "lag", "in_flight", "held", "workers")}
    names = sorted({name for samples, _ in per_worker for s in samples for name in s.breakers})
    breakers: dict[str, list[str | None]] = {name: [] for name in names}
    cursors = [0] * len(per_worker)
    for tick in ticks:
        counted: list[tuple[Sample, float | None]] = []
        for i, (samples, rate) in enumerate(per_worker):
            while cursors[i] < len(samples) and samples[cursors[i]].at <= tick:
                cursors[i] += 1
            j = cursors[i] - 1  # the latest sample at or before the tick
            if j >= 0 and tick - samples[j].at < stale:
                counted.append((samples[j], rate[j]))
        out["t"].append(round(tick, 3))
        out["workers"].append(len(counted))
        known_rates = [r for _, r in counted if r is not None]
        out["ended_per_s"].append(round(sum(known_rates), 3) if known_rates else None)
        for key in ("lag", "in_flight", "held"):
            out[key].append(sum(getattr(s, key) for s, _ in counted) if counted else None)
        for name in names:
            breakers[name].append(_worst([s.breakers[name] for s, _ in counted if name in s.breakers]))
    return {"series": out, "breakers": breakers}
