"""B3: end-to-end latency (publish → result on agent.results) at half of B1's rate, with the instant `local`
provider (so no provider time is in the figure). Send and arrival are stamped in the same process (one
monotonic clock); the first two seconds of sends are warm-up and not counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import common
from bench.common import percentile, publish_paced, task_ids
from bench.report import Row

WARMUP_S = 2.0


async def run(tmp: Path, rate: float, seconds: float) -> tuple[list[Row], dict[str, Any]]:
    async with common.one_worker(tmp, "b3") as flow:
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
           "max_ms": max(lat) if lat else float("nan"), "complete": complete}
    rows = [
        Row("B3", f"latency p50 at {rate:,.0f} tasks/s ({len(lat):,} tasks, local provider)", f"{p50:.1f} ms",
            "≤ 20 ms", p50 <= 20),
        Row("B3", "latency p99", f"{p99:.1f} ms", "≤ 100 ms", p99 <= 100),
        Row("B3", "latency max", f"{res['max_ms']:.1f} ms"),
    ]
    if not complete:
        rows.append(Row("B3", "  INCOMPLETE", f"{len(lat)}/{len(counted)} results before the timeout"))
    return rows, res
