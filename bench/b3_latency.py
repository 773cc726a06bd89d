"""B3: end-to-end latency (publish → result on agent.results) at a steady pace, with the instant `local` provider
(so no provider time is in the figure). Send and arrival are stamped in the same process (one monotonic clock);
the first two seconds of sends are warm-up and not counted.

The pace is half of the worker's *sustained* rate, found first on the same worker: the highest paced rate it keeps
up with for ``probe_s`` (60 s in a full run). A probe keeps up when the tasks published in its last 10 seconds were
answered with a p99 under one second (a worker that falls behind answers later and later) and every task of the
probe had its result within 10 s of the last publish. Probes start at B1's burst rate and go down by a fifth until
one keeps up (at most ``MAX_PROBES``). A burst rate is not a sustained one: in a burst every produce request, flush
and fetch carries many tasks, at a steady pace few.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import common
from bench.common import percentile, publish_paced, task_ids
from bench.report import Row

WARMUP_S = 2.0
#: a probe's tail: the tasks published in its last seconds tell whether the worker kept up
TAIL_S = 10.0
#: p99 latency of the tail under which the worker kept up
KEPT_UP_P99_MS = 1000.0
#: how long after a probe's last publish its results may take
DRAIN_S = 10.0
MAX_PROBES = 6
STEP = 0.8


async def _probe(flow: Any, rate: float, seconds: float, name: str) -> dict[str, Any]:
    ids = task_ids(name, int(rate * seconds))
    sent: dict[str, float] = {}
    await publish_paced(flow.topic, flow.agent, ids, rate, sent)
    drained = await flow.out.wait_all(ids, timeout=DRAIN_S)
    if not drained:  # fell behind: let the backlog go through before the next probe
        await flow.out.wait_all(ids, timeout=300)
    last = max(sent.values())
    tail = [(flow.out.seen[i] - sent[i]) * 1000 for i in ids if last - sent[i] <= TAIL_S and i in flow.out.seen]
    p99 = percentile(tail, 99) if tail else float("inf")
    return {"rate": rate, "n": len(ids), "tail_p99_ms": p99, "drained": drained,
            "kept_up": drained and p99 <= KEPT_UP_P99_MS}


async def run(tmp: Path, burst: float, seconds: float, probe_s: float,
              rate: float | None = None) -> tuple[list[Row], dict[str, Any]]:
    """``burst``: B1's rate, where the probes start; ``rate``: measure there instead (no search)."""
    probes: list[dict[str, Any]] = []
    async with common.one_worker(tmp, "b3") as flow:
        sustained = None
        if rate is None:
            probe = burst
            for k in range(MAX_PROBES):
                found = await _probe(flow, probe, probe_s, f"b3probe{k}")
                probes.append(found)
                print(f"  B3 probe {probe:,.0f} tasks/s for {probe_s:.0f} s: tail p99 {found['tail_p99_ms']:,.0f} ms, "
                      f"{'kept up' if found['kept_up'] else 'fell behind'}", flush=True)
                if found["kept_up"]:
                    sustained = probe
                    break
                probe *= STEP
            rate = (sustained or probe) / 2
        ids = task_ids("b3", int(rate * (seconds + WARMUP_S)))
        sent: dict[str, float] = {}
        await publish_paced(flow.topic, flow.agent, ids, rate, sent)
        complete = await flow.out.wait_all(ids, timeout=60)
        seen = dict(flow.out.seen)
    first = min(sent.values())
    counted = [i for i in ids if sent[i] - first >= WARMUP_S]
    lat = [(seen[i] - sent[i]) * 1000 for i in counted if i in seen]
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    res = {"rate": rate, "n": len(counted), "done": len(lat), "p50_ms": p50, "p99_ms": p99,
           "max_ms": max(lat) if lat else float("nan"), "complete": complete, "sustained": sustained,
           "burst": burst, "probes": probes}
    rows = []
    if probes:
        tried = ", ".join(f"{p['rate']:,.0f}{'' if p['kept_up'] else ' (behind)'}" for p in probes)
        value = (f"{sustained:,.0f} tasks/s ({sustained / burst:.0%} of B1's burst rate, {burst:,.0f})" if sustained
                 else f"below {probes[-1]['rate']:,.0f} tasks/s (no probe kept up)")
        rows.append(Row("B3", f"sustained rate: highest paced rate kept up for {probe_s:.0f} s (probes: {tried})",
                        value))
    rows += [
        Row("B3", f"latency p50 at {rate:,.0f} tasks/s{', half the sustained rate' if sustained else ''} "
                  f"({len(lat):,} tasks, local provider)", f"{p50:.1f} ms", "≤ 20 ms", p50 <= 20),
        Row("B3", "latency p99", f"{p99:.1f} ms", "≤ 100 ms", p99 <= 100),
        Row("B3", "latency max", f"{res['max_ms']:.1f} ms"),
    ]
    if not complete:
        rows.append(Row("B3", "  INCOMPLETE", f"{len(lat)}/{len(counted)} results before the timeout"))
    return rows, res
