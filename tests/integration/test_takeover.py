"""Takeover in seconds (docs/security.md, "Fencing"): a SIGKILLed worker's interrupted tasks run again on the
worker that gets its partitions as soon as the group has expelled it, not once their 30 s leases lapse; a worker
that joins while calls run elsewhere takes none of them over (their owner is still a member)."""

from __future__ import annotations

import asyncio
import time

from agents_stream.contract import topics

from .harness import encode, eventually, produce, results_for, task, unique
from .test_failures import assert_one_distinct_success, calls_per_task

LEASE_S = 30.0
#: the lines of a worker's log that say how a takeover went (printed when it was slow)
WHAT_TAKEOVER_LOGS = ("Joined group", "members", "dispatching it here", "Heartbeat failed", "Revoking", "Worker ready")


async def test_a_killed_workers_tasks_finish_long_before_their_leases_lapse(cluster_factory, fake_llm):
    agent = unique("analyzer")
    toml = (f'[providers.fake]\nkind = "openai"\nbase_url = "{fake_llm.url}/v1"\nmodel = "fake-model"\n'
            f'timeout_s = 40\n\n[agents.{agent}]\nproviders = ["fake"]\n')  # the 25 s calls do not time out
    c = cluster_factory([agent], fake_llm.url, toml=toml, AGENTS_STREAM_LEASE_TTL_S=str(LEASE_S),
                        AGENTS_STREAM_SESSION_TIMEOUT_S="6")
    await fake_llm.set_mode(latency=25.0)
    w0 = await c.started("w0")
    ts = [task(agent, n=i) for i in range(16)]
    ids = {t["task_id"] for t in ts}
    await produce(topics.task_topic(agent), [encode(t) for t in ts])
    await eventually(lambda: fake_llm.in_flight >= 16, timeout=30, interval=0.1, what="16 calls in flight on w0")

    w1 = await c.started("w1")  # a scale-out while every call runs on w0: w0 is a member, so nothing is taken over
    await asyncio.sleep(4.0)
    calls = calls_per_task(fake_llm, ids)
    assert all(calls[t] == 1 for t in ids), f"a live owner's task was taken over on a scale-out: {calls}"

    await fake_llm.set_mode(latency=0.2)
    killed = time.monotonic()
    w0.kill()
    results = await results_for(ids, timeout=60)
    last = time.monotonic() - killed
    assert_one_distinct_success(results, ids)
    calls = calls_per_task(fake_llm, ids)
    print(f"\ntakeover: 16 interrupted tasks answered {last:.1f}s after the SIGKILL (lease {LEASE_S:.0f}s); "
          f"calls per task max {max(calls.values())}")
    assert last < LEASE_S / 2, (
        f"the last interrupted task answered {last:.1f}s after the kill: its lease waited out. w1's log:\n"
        + "\n".join(line for line in w1.tail(4000).splitlines() if any(w in line for w in WHAT_TAKEOVER_LOGS))
    )
    assert max(calls.values()) <= 2, calls
