"""B3: end-to-end latency (publish → result on agent.results) at half of B1's rate, with the instant `local`
provider (so no provider time is in the figure). Send and arrival are stamped in the same process (one
monotonic clock); the first two seconds of sends are warm-up and not counted.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from bench import common
from bench.common import PRODUCT_DEFAULTS, Watch, flow_ready, percentile, publish_paced, task_ids, unique
from bench.report import Row
from tests.integration.harness import Cluster

WARMUP_S = 2.0


async def run(tmp: Path, rate: float, seconds: float) -> tuple[list[Row], dict[str, Any]]:
    agent = unique("b3")
    cluster = Cluster(common.subdir(tmp, "cluster"), [agent], None, settings=dict(PRODUCT_DEFAULTS))
    worker = common.track(cluster.worker().start())
    out = Watch("agent.results")
    try:
        await worker.wait_ready(timeout=120)
        topic = f"agent.tasks.{agent}"
        await out.start()
        await flow_ready(topic, out, agent)
        ids = task_ids("b3", int(rate * (seconds + WARMUP_S)))
        sent: dict[str, float] = {}
        await publish_paced(topic, agent, ids, rate, sent)
        complete = await out.wait_all(ids, timeout=60)
    except Exception:
        print(worker.tail(), file=sys.stderr)
        raise
    finally:
        await out.stop()
        worker.close()
    first = min(sent.values())
    counted = [i for i in ids if sent[i] - first >= WARMUP_S]
    lat = [(out.seen[i] - sent[i]) * 1000 for i in counted if i in out.seen]
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    res = {"rate": rate, "n": len(counted), "done": len(lat), "p50_ms": p50, "p99_ms": p99,
           "max_ms": max(lat) if lat else float("nan"), "complete": complete}
    rows = [
        Row("B3", f"latency p50 at {rate:,.0f} tasks/s ({len(lat):,} tasks, local provider)", f"{p50:.1f} ms", "≤ 20 ms", p50 <= 20),
        Row("B3", "latency p99", f"{p99:.1f} ms", "≤ 100 ms", p99 <= 100),
        Row("B3", "latency max", f"{res['max_ms']:.1f} ms"),
    ]
    if not complete:
        rows.append(Row("B3", "  INCOMPLETE", f"{len(lat)}/{len(counted)} results before the timeout"))
    return rows, res
