"""B4: a worker SIGKILLed under steady load (2 workers, one app id, 8 partitions).

The provider is `local` with 0.5 s of simulated latency, so half a second of work is in flight on the
killed worker. Which worker owns which partition is read from the task table's changelog (a task's lease record
names the worker that took it; the changelog is co-partitioned with the task topic). Three figures:
- partitions back: seconds from the SIGKILL until each partition the killed worker owned produced a result
  for a task published after the kill (first and last partition). Bound: the group session timeout
  (AGENTS_STREAM_SESSION_TIMEOUT_S, 10 s) plus a rebalance.
- unanswered tasks: every task published until 5 s before the end must have a result (nothing lost), given 60 s
  more to work through what queued while the group rebalanced.
- interrupted tasks: tasks the killed worker had taken (leased) without finishing; seconds from the kill
  until the last of them has its result. Bound: the lease (AGENTS_STREAM_LEASE_TTL_S, 30 s, counted from
  the last heartbeat) plus a lease-scan interval (TTL / 4).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench import common
from bench.common import PRODUCT_DEFAULTS, Watch, flow_ready, lease_owner, partition_of, publish_paced, task_ids, unique
from bench.report import Row
from tests.integration.harness import Cluster

LATENCY_S = 0.5
TARGET_S = 15.0
DRAIN_S = 60.0  # after the end, how long the survivor has to answer what queued during the failover


def _config(agent: str) -> str:
    return f'[providers.local]\nkind = "local"\nlatency_s = {LATENCY_S}\n\n[agents.{agent}]\nproviders = ["local"]\n'


async def run(tmp: Path, rate: float, before_s: float, after_timeout_s: float) -> tuple[list[Row], dict[str, Any]]:
    agent = unique("b4")
    cluster = Cluster(common.subdir(tmp, "cluster"), [agent], None, settings=dict(PRODUCT_DEFAULTS),
                      toml=_config(agent))
    topic = f"agent.tasks.{agent}"
    w0 = common.track(cluster.worker("w0").start())
    out = Watch("agent.results")
    leases = Watch(f"{cluster.app_id}-tasks-changelog", keep_values=True)
    owner: dict[int, int] = {}  # partition → pid of the worker that leased a task of it last
    watcher: asyncio.Task | None = None
    publisher: asyncio.Task | None = None
    w1 = None
    try:
        await w0.wait_ready(timeout=120)
        w1 = common.track(cluster.worker("w1").start())
        await w1.wait_ready(timeout=120)
        await out.start()
        await leases.start()
        await flow_ready(topic, out, agent)

        async def follow() -> None:
            # each task's first changelog record is its lease, naming the worker that took it: latest per partition
            done: set[str] = set()
            while True:
                for key, value in list(leases.values.items()):
                    if key in done:
                        continue
                    done.add(key)
                    worker = lease_owner(value)
                    if worker:
                        owner[partition_of(json.loads(key))] = int(worker.split(":")[1])
                await asyncio.sleep(0.1)

        watcher = asyncio.ensure_future(follow())
        total = int(rate * (before_s + after_timeout_s))
        ids = task_ids("b4", total)
        sent: dict[str, float] = {}
        publisher = asyncio.ensure_future(publish_paced(topic, agent, ids, rate, sent))
        await asyncio.sleep(before_s)
        # ownership from the leases of the last few seconds only (the rebalance after w1 joined had completed)
        owner.clear()
        await asyncio.sleep(min(3.0, before_s / 2))
        victim = w1.proc.pid
        killed_parts = sorted(p for p, pid in owner.items() if pid == victim)
        if not killed_parts:
            raise RuntimeError(f"w1 owned no partition after {before_s:.0f}s of load (owners: {owner})")
        t_kill = time.monotonic()
        w1.kill()
        pending_at_kill = [i for i in sent if i not in out.seen and partition_of(i) in killed_parts]
        # wait: every killed partition back, and every task published before the kill finished
        deadline = t_kill + after_timeout_s
        back: dict[int, float] = {}
        while time.monotonic() < deadline:
            for i, at in list(out.seen.items()):
                s = sent.get(i)
                if s is not None and s > t_kill:
                    p = partition_of(i)
                    if p in killed_parts and p not in back:
                        back[p] = at - t_kill
            if len(back) == len(killed_parts) and all(i in out.seen for i in pending_at_kill):
                break
            await asyncio.sleep(0.2)
        publisher.cancel()
        resumed = [out.seen[i] - t_kill for i in pending_at_kill if i in out.seen]
        # Nothing lost: every task sent until 5 s before the publisher stopped gets its result, whoever ran it. The
        # survivor may still be working through what queued while the group rebalanced (the faster the takeover,
        # the sooner the wait above ends), so it has DRAIN_S more to finish; what is still missing then is lost.
        stopped = time.monotonic()
        due = [i for i, at in sent.items() if at < stopped - 5.0]
        while time.monotonic() < stopped + DRAIN_S and not all(i in out.seen for i in due):
            await asyncio.sleep(0.2)
        drained_s = time.monotonic() - stopped
        unanswered = sorted((i for i in due if i not in out.seen), key=lambda i: sent[i])
        lost = []
        for i in pending_at_kill:
            if i not in out.seen:  # what the survivor's ledger says about it
                try:
                    state = await w0.get(f"/tasks/{i}")
                except Exception as exc:
                    state = repr(exc)
                lost.append({"task_id": i, "partition": partition_of(i),
                             "sent_before_kill_s": round(t_kill - sent[i], 3),
                             "ledger": state})
        late = [x for x in resumed if x > max(back.values(), default=0.0) + 1.0]
    except Exception:
        print(w0.tail(), file=sys.stderr)
        if w1 is not None:
            print(w1.tail(), file=sys.stderr)
        raise
    finally:
        for t in (watcher, publisher):
            if t is not None:
                t.cancel()
        await out.stop()
        await leases.stop()
        cluster.close()
    res = {
        "rate": rate, "killed_partitions": killed_parts, "back_s": back,
        "first_back_s": min(back.values(), default=float("nan")),
        "all_back_s": max(back.values(), default=float("nan")),
        "pending_at_kill": len(pending_at_kill), "pending_done": len(resumed),
        "interrupted": len(late), "interrupted_last_s": max(late, default=float("nan")),
        "pending_last_s": max(resumed, default=float("nan")), "without_result": lost,
        "unanswered": len(unanswered), "unanswered_of": len(due), "drained_s": drained_s,
        "unanswered_sample": [{"task_id": i, "partition": partition_of(i),
                               "sent_after_kill_s": round(sent[i] - t_kill, 3)}
                              for i in unanswered[:20]],
    }
    all_back = res["all_back_s"]
    rows = [
        Row("B4", f"SIGKILL 1 of 2 workers at {rate:,.0f} tasks/s: its {len(killed_parts)} partitions processing "
            "again on the survivor",
            f"first {res['first_back_s']:.1f} s, all {all_back:.1f} s", f"≤ {TARGET_S:.0f} s", all_back <= TARGET_S),
        Row("B4", f"  interrupted leased tasks ({len(late)} of {len(pending_at_kill)} unfinished at the kill) resumed",
            f"last result {res['interrupted_last_s']:.1f} s after the kill", "lease 30 s + scan 7.5 s"),
    ]
    rows.append(Row("B4", f"  tasks published (until 5 s before the end) without a result after {DRAIN_S:.0f} s more",
                    f"{len(unanswered):,} of {len(due):,} (the last answered {drained_s:.1f} s after the end)", "0",
                    not unanswered))
    if len(resumed) < len(pending_at_kill) or len(back) < len(killed_parts):
        rows.append(Row("B4", "  INCOMPLETE", f"{len(resumed)}/{len(pending_at_kill)} unfinished tasks and "
                        f"{len(back)}/{len(killed_parts)} partitions back within {after_timeout_s:.0f}s"))
    return rows, res
