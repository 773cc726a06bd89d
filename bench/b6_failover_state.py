"""B6: failover when the task table is large: 2 workers whose table holds N finished task records (written
straight to its changelog, as B5 does), one SIGKILLed under steady load; seconds until each partition it owned
produced a result again on the survivor.

The victim is the worker that started first: it owned every partition before the second joined, so the survivor
never had the victim's partitions active. Only a standby copy (AGENTS_STREAM_STANDBY_REPLICAS, Faust's
``table_standby_replicas``, 1 by default) lets it take them over without replaying their changelog first. Run with
``standby=0`` the same figure is the cold recovery. Before the kill the run waits until the survivor's standby
copy is no longer growing (its RocksDB files), so the figure is a failover from a warm copy, not a race with the
standby's first read.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench import common
from bench.b5_memory import _delete_topic, load_changelog
from bench.common import PRODUCT_DEFAULTS, Watch, flow_ready, lease_owner, partition_of, publish_paced, task_ids, unique
from bench.report import Row
from tests.integration.harness import Cluster

TARGET_S = 15.0
LATENCY_S = 0.05


def _config(agent: str) -> str:
    return f'[providers.local]\nkind = "local"\nlatency_s = {LATENCY_S}\n\n[agents.{agent}]\nproviders = ["local"]\n'


def _bytes_under(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


async def _quiet(path: Path, quiet_s: float, timeout: float) -> float:
    """Wait until the files under ``path`` stop growing for ``quiet_s``; seconds waited."""
    started, last, since = time.monotonic(), -1, time.monotonic()
    while time.monotonic() - started < timeout:
        size = _bytes_under(path)
        if size != last:
            last, since = size, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
        await asyncio.sleep(1.0)
    return time.monotonic() - started


async def run(tmp: Path, n: int, *, standby: int = 1, rate: float = 40.0, after_timeout_s: float = 300.0,
              ) -> tuple[list[Row], dict[str, Any]]:
    agent = unique("b6")
    settings = {**PRODUCT_DEFAULTS, "AGENTS_STREAM_STANDBY_REPLICAS": str(standby)}
    cluster = Cluster(common.subdir(tmp, "cluster"), [agent], None, settings=settings, toml=_config(agent))
    topic = f"agent.tasks.{agent}"
    changelog = f"{cluster.app_id}-tasks-changelog"
    _, load_s, size = await load_changelog(changelog, agent, n)
    out = Watch("agent.results")
    leases = Watch(changelog, keep_values=True)  # each task's lease record names the worker that took it
    publisher: asyncio.Task | None = None
    victim = survivor = None
    try:
        t0 = time.monotonic()
        victim = common.track(cluster.worker("w0").start())
        await victim.wait_ready(timeout=1800)
        first_ready_s = time.monotonic() - t0
        t1 = time.monotonic()
        survivor = common.track(cluster.worker("w1").start())
        await survivor.wait_ready(timeout=1800)
        second_ready_s = time.monotonic() - t1
        await out.start()
        await leases.start()
        await flow_ready(topic, out, agent)
        standby_s = await _quiet(cluster.tmp / "data-w1", quiet_s=10.0, timeout=1800)
        ids = task_ids("b6", int(rate * (20 + after_timeout_s)))
        sent: dict[str, float] = {}
        publisher = asyncio.ensure_future(publish_paced(topic, agent, ids, rate, sent))
        await asyncio.sleep(8.0)
        owner: dict[int, str] = {}
        for key, value in list(leases.values.items())[-400:]:
            worker = lease_owner(value)
            if worker:
                owner[partition_of(json.loads(key))] = worker
        pid = str(victim.proc.pid)
        killed = sorted(p for p, w in owner.items() if w.split(":")[1:2] == [pid])
        if not killed:
            raise RuntimeError(f"the first worker owned no partition under load (owners: {owner})")
        t_kill = time.monotonic()
        victim.kill()
        back: dict[int, float] = {}
        while time.monotonic() - t_kill < after_timeout_s and len(back) < len(killed):
            for i, at in list(out.seen.items()):
                s = sent.get(i)
                if s is not None and s > t_kill and partition_of(i) in killed and partition_of(i) not in back:
                    back[partition_of(i)] = at - t_kill
            await asyncio.sleep(0.2)
    except Exception:
        for w in (victim, survivor):
            if w is not None:
                print(w.tail(), file=sys.stderr)
        raise
    finally:
        if publisher is not None:
            publisher.cancel()
        await out.stop()
        await leases.stop()
        cluster.close()
        await _delete_topic(changelog)
    all_back = max(back.values(), default=float("nan"))
    res = {"n": n, "standby": standby, "load_s": load_s, "changelog_bytes": size, "first_ready_s": first_ready_s,
           "second_ready_s": second_ready_s, "standby_settled_s": standby_s, "killed_partitions": killed,
           "back_s": back, "all_back_s": all_back, "complete": len(back) == len(killed)}
    mb = size / 1024 / 1024
    rows = [
        Row("B6", f"SIGKILL 1 of 2 workers whose table holds {n:,} records ({mb:,.0f} MB of changelog, standby "
            f"replicas {standby}): its {len(killed)} partitions processing again on the survivor",
            f"first {min(back.values(), default=float('nan')):.1f} s, all {all_back:.1f} s", f"≤ {TARGET_S:.0f} s",
            res["complete"] and all_back <= TARGET_S),
        Row("B6", f"  before the kill: first worker ready after {first_ready_s:.0f} s (all {n:,} records), the second "
            f"after {second_ready_s:.0f} s, its standby copy settled {standby_s:.0f} s later", ""),
    ]
    return rows, res
