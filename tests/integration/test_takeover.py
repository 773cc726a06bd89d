"""Takeover in seconds (docs/security.md, "Fencing"): a SIGKILLed worker's interrupted tasks run again on the
worker that gets its partitions as soon as the group has expelled it, not once their 30 s leases lapse; a worker
that joins while calls run elsewhere takes none of them over (their owner is still a member)."""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from pathlib import Path

import pytest

from agents_stream.contract import topics

from .harness import encode, eventually, produce, results_for, task, unique
from .test_failures import assert_one_distinct_success, calls_per_task

LEASE_S = 30.0
#: the lines of a worker's log that say how a takeover went (printed when it was slow)
WHAT_TAKEOVER_LOGS = ("Joined group", "members", "dispatching it here", "Heartbeat failed", "Revoking", "Worker ready",
                      "arrived again", "before this worker claimed", "steps after this rebalance", "committed offsets",
                      "reading it again", "delivered none", "Recovery complete", "owner epochs")


async def _calls_in_flight(cluster_factory, fake_llm, n: int, **settings: str):
    """A cluster with one worker, w0, running ``n`` calls of 25 s (the provider's timeout outlasts them): the
    cluster, w0 and the tasks' ids."""
    agent = unique("analyzer")
    toml = (f'[providers.fake]\nkind = "openai"\nbase_url = "{fake_llm.url}/v1"\nmodel = "fake-model"\n'
            f'timeout_s = 40\n\n[agents.{agent}]\nproviders = ["fake"]\n')
    settings.setdefault("AGENTS_STREAM_SESSION_TIMEOUT_S", "6")
    c = cluster_factory([agent], fake_llm.url, toml=toml, AGENTS_STREAM_LEASE_TTL_S=str(LEASE_S), **settings)
    await fake_llm.set_mode(latency=25.0)
    w0 = await c.started("w0")
    ts = [task(agent, n=i) for i in range(n)]
    await produce(topics.task_topic(agent), [encode(t) for t in ts])
    try:
        await eventually(lambda: fake_llm.in_flight >= n, timeout=30, interval=0.1, what=f"{n} calls in flight on w0")
    except AssertionError as exc:  # what w0 did with its tasks instead (seen once in make test's serial phase)
        raise AssertionError(f"{exc}; {fake_llm.in_flight} in flight, {len(fake_llm.requests)} requests seen; "
                             f"w0's log:\n{w0.tail(6000)}") from None
    return c, w0, {t["task_id"] for t in ts}


# Both bound how long a takeover takes (less than half a lease): a second test's CPU stretched the group's
# session expiry, the recovery and the re-read of the moved partitions past that in make test's two-at-a-time phase.
@pytest.mark.exclusive
async def test_a_killed_workers_tasks_finish_long_before_their_leases_lapse(cluster_factory, fake_llm):
    c, w0, ids = await _calls_in_flight(cluster_factory, fake_llm, 16)

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
    if last >= LEASE_S / 2:  # kept for a post-mortem: pytest keeps only its last three temp dirs
        kept = Path(__file__).resolve().parents[2] / ".data" / "failed" / f"takeover-{int(time.time())}"
        kept.mkdir(parents=True, exist_ok=True)
        for w in (w0, w1):
            shutil.copy(w.log_path, kept / w.log_path.name)
    assert last < LEASE_S / 2, (
        f"the last interrupted task answered {last:.1f}s after the kill: its lease waited out. w1's log:\n"
        + "\n".join(line for line in w1.tail(4000).splitlines() if any(w in line for w in WHAT_TAKEOVER_LOGS))
    )
    assert max(calls.values()) <= 2, calls


@pytest.mark.exclusive
async def test_a_worker_restarted_under_its_static_membership_id_takes_its_tasks_over_at_once(cluster_factory,
                                                                                                fake_llm):
    """Static membership (AGENTS_STREAM_INSTANCE_ID), as a supervisor restarts a killed worker: same id, same data
    dir, here a new web port. The new process takes its predecessor's place in the group without a rebalance, keeps
    reading (the assignment made for the old address does not stop it), and takes the killed process's tasks over
    at once: the group goes on describing the member with the old process's client id, so members are matched by
    instance id."""
    # A session longer than a restart (one can take over 6 s on a loaded machine): the new process always comes back
    # while its predecessor is still a member, so it always gets the assignment made for the old address.
    c, w0, ids = await _calls_in_flight(cluster_factory, fake_llm, 8, AGENTS_STREAM_INSTANCE_ID="pod-0",
                                        AGENTS_STREAM_SESSION_TIMEOUT_S="20")

    await fake_llm.set_mode(latency=0.2)
    killed = time.monotonic()
    w0.kill()
    again = await c.started("w0")  # the same name and data dir; a new web port
    results = await results_for(ids, timeout=60)
    last = time.monotonic() - killed
    assert_one_distinct_success(results, ids)
    calls = calls_per_task(fake_llm, ids)
    print(f"\nstatic membership: 8 interrupted tasks answered {last:.1f}s after the SIGKILL and restart (lease "
          f"{LEASE_S:.0f}s); calls per task max {max(calls.values())}")
    assert "asks the group for a new generation" in again.tail(4000), "the restart on a new port was noticed"
    assert last < LEASE_S / 2, (
        f"the last interrupted task answered {last:.1f}s after the kill: its lease waited out. The new process's "
        "log:\n" + "\n".join(ln for ln in again.tail(4000).splitlines() if any(w in ln for w in WHAT_TAKEOVER_LOGS))
    )
    assert max(calls.values()) <= 2, calls


def _generations(log: str) -> list[int]:
    """The group generations a worker's log says it joined, in order."""
    return [int(g) for g in re.findall(r"Joined group '[^']*' \(generation (\d+)\)", log)]


async def test_a_graceful_restart_under_static_membership_moves_no_partition(cluster_factory, fake_llm):
    """A SIGTERM and a start again under the same static membership id and address, within the session timeout
    (20 s here, longer than a stop and a start): the group does not rebalance — the other worker keeps its
    partitions all along, the restarted one gets its own back in the same generation — and every task is answered."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url, AGENTS_STREAM_SESSION_TIMEOUT_S="20")
    w0 = await c.started("w0", AGENTS_STREAM_INSTANCE_ID="pod-0")
    w1 = await c.started("w1", AGENTS_STREAM_INSTANCE_ID="pod-1")
    before = [task(agent, n=i) for i in range(8)]
    await produce(topics.task_topic(agent), [encode(t) for t in before])
    assert_one_distinct_success(await results_for({t["task_id"] for t in before}, timeout=60),
                                {t["task_id"] for t in before})
    generation = _generations(w1.tail(4000))[-1]
    assert _generations(w0.tail(4000))[-1] == generation, "both workers are in the group's current generation"

    code, took = w0.terminate()
    again = await c.started("w0", AGENTS_STREAM_INSTANCE_ID="pod-0", WEB_PORT=w0.env["WEB_PORT"])
    after = [task(agent, n=i) for i in range(8, 16)]
    await produce(topics.task_topic(agent), [encode(t) for t in after])
    assert_one_distinct_success(await results_for({t["task_id"] for t in after}, timeout=60),
                                {t["task_id"] for t in after})
    rejoined = _generations(again.tail(4000))[-1]  # the log file is shared by both processes of w0; its last join
    print(f"\ngraceful restart under static membership: stopped in {took:.1f}s (exit {code}); generation "
          f"{generation} before, {rejoined} after; w1 joined {_generations(w1.tail(4000))}")
    assert _generations(w1.tail(4000))[-1] == generation, "the other worker rejoined: the restart moved partitions"
    assert rejoined == generation, "the restarted worker came back in a new generation: the group rebalanced"
