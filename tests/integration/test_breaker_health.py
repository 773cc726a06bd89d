"""The breaker tells a degraded provider from a dead one, and a recovered provider gets its traffic back without
waiting for traffic: two worker processes, fake LLM servers over HTTP, the real broker.

The counts are printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agents_stream.contract import topics
from agents_stream.testing.fakellm import FakeLLM

from .harness import Worker, encode, eventually, produce, results_for, task, unique
from .test_resilience import agent_toml, decoded, provider


async def breaker_of(w: Worker, name: str) -> dict[str, Any]:
    """The worker's folded view of one provider's breaker (GET /circuits)."""
    return (await w.get("/circuits"))["providers"][name]


def by_tier(results: dict[str, dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in results.values():
        tier = r["source"].split(":")[0]
        out[tier] = out.get(tier, 0) + 1
    return out


async def test_a_recovered_primary_is_closed_by_probes_and_takes_the_whole_next_burst(cluster_factory):
    """Primary down (its breaker opens), then healthy with no traffic at all: the workers' own probes close the
    breaker, and a burst of 20 tasks all reach the primary at confidence high."""
    open_timeout, success_threshold = 3.0, 2
    async with FakeLLM() as primary, FakeLLM() as alternate:
        await primary.set_mode(latency=0.02)
        agent = unique("burst")
        toml = (
            f"[breaker]\nfailure_threshold = 3\nsuccess_threshold = {success_threshold}\n"
            f"open_timeout_s = {open_timeout}\nwindow_s = 30\n\n"
            + provider("primary", primary)
            + provider("alternate", alternate, kind="anthropic")
            + agent_toml(agent, providers=["primary", "alternate"])
        )
        c = cluster_factory([agent], None, toml=toml)
        workers = await asyncio.gather(c.started("a"), c.started("b"))
        await primary.set_mode(outage=True)
        down = [task(agent, n=i) for i in range(10)]
        await produce(topics.task_topic(agent), [encode(t) for t in down])
        first = decoded(await results_for({t["task_id"] for t in down}, timeout=90))
        assert all(r["source"].startswith("alternate:") for r in first.values()), "the outage's tasks fell back"
        await eventually(lambda: _all_state(workers, "open"), timeout=30, interval=0.2, what="the breaker open")
        await asyncio.sleep(open_timeout + 1)  # a probe fails while it is still down: it reopens
        await primary.set_mode(outage=False)
        recovered = time.time()
        await eventually(lambda: _all_state(workers, "closed"), timeout=4 * open_timeout + 30, interval=0.2,
                         what="the probes to close the breaker with no task traffic")
        closed_in = time.time() - recovered
        probes = [r for r in primary.requests if r.instruction == "ping"]
        burst = [task(agent, n=100 + i) for i in range(20)]
        await produce(topics.task_topic(agent), [encode(t) for t in burst])
        results = decoded(await results_for({t["task_id"] for t in burst}, timeout=90))
    print(
        f"\nrecovery: closed {closed_in:.1f}s after the primary recovered (open_timeout {open_timeout:g}s), by "
        f"{len(probes)} one-token probes in all ({sum(1 for r in probes if r.ts >= recovered)} after recovery); "
        f"burst of {len(burst)}: {by_tier(results)}"
    )
    assert by_tier(results) == {"primary": 20}
    assert all(r["status"] == "succeeded" and r["confidence"] == "high" for r in results.values())
    assert sum(1 for r in probes if r.ts >= recovered) <= success_threshold + 1, "one probe at a time, cluster-wide"


async def _all_state(workers: list[Worker], state: str) -> bool:
    states = [(await breaker_of(w, "primary"))["state"] for w in workers]
    return all(s == state for s in states)


async def test_a_provider_failing_one_call_in_ten_stays_closed_and_its_errors_are_retried(cluster_factory):
    """A primary with 100 ms latency, 1,000 tasks through two workers with the default breaker, healthy and then
    answering 10% of calls with a 500: the breaker never opens, every task is answered by the primary (the
    breaker before the failure-rate rule answered 964 of 1,000 in 300 s, with 10 opens); both rates are printed."""
    async with FakeLLM() as flaky, FakeLLM() as alternate:
        await flaky.set_mode(latency=0.1, seed=15)
        agent = unique("flaky")
        toml = (
            provider("primary", flaky)
            + provider("alternate", alternate, kind="anthropic")
            + agent_toml(agent, providers=["primary", "alternate"])
        )
        c = cluster_factory([agent], None, toml=toml)
        workers = await asyncio.gather(c.started("a"), c.started("b"))
        await _rate(agent, 200)  # warm-up: connections, the first fetches and commits
        healthy, _ = await _rate(agent, 1000)
        await flaky.set_mode(error_rate=0.1)
        calls_before = len(flaky.requests)
        degraded, results = await _rate(agent, 1000)
        views = [await breaker_of(w, "primary") for w in workers]
    calls = len(flaky.requests) - calls_before
    print(
        f"\n10% errors: healthy {healthy:.0f} tasks/s, degraded {degraded:.0f} tasks/s ({degraded / healthy:.0%}); "
        f"{calls} calls for {len(results)} tasks ({calls - len(results)} retried errors), by tier {by_tier(results)}, "
        f"breaker opens {[v['opens'] for v in views]}, failure rate seen {[v.get('failure_rate') for v in views]}"
    )
    assert [v["opens"] for v in views] == [0, 0] and [v["state"] for v in views] == ["closed", "closed"]
    assert by_tier(results) == {"primary": len(results)}, "errors were retried on the primary, never fell back"
    assert alternate.requests == []
    # The rates are printed, not asserted: a timed assertion flakes on a shared machine (seen: 45% to 228%). What
    # cost two orders of magnitude before the fix (about 3 tasks/s) was the breaker opening and the tasks falling
    # to the alternate: both are asserted above.


async def _rate(agent: str, n: int) -> tuple[float, dict[str, dict[str, Any]]]:
    """Publish ``n`` tasks at once; tasks/s from the publish to the broker time of the last result."""
    ts = [task(agent, n=i) for i in range(n)]
    started = time.time()
    await produce(topics.task_topic(agent), [encode(t) for t in ts])
    raw = await results_for({t["task_id"] for t in ts}, timeout=300)
    last = max(m.timestamp / 1000.0 for msgs in raw.values() for m in msgs)
    return n / (last - started), decoded(raw)
