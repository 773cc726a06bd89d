"""SIGTERM: intake stops, calls in flight finish within the grace, /readyz says 503, the rest resumes elsewhere."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import aiohttp

from agents_stream.contract import topics

from .harness import all_committed, encode, eventually, produce, results_for, task, unique


async def _readyz_status(port: int) -> int | None:
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/readyz", timeout=aiohttp.ClientTimeout(total=2)) as r:
                return r.status
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None  # the port closed: the worker is gone


async def test_sigterm_finishes_calls_in_flight_and_leaves_the_rest_to_the_next_worker(cluster_factory, fake_llm):
    agent = unique("drain")
    c = cluster_factory([agent], fake_llm.url)
    w0 = await c.started("w0", AGENTS_STREAM_MAX_IN_FLIGHT="2", AGENTS_STREAM_SHUTDOWN_GRACE_S="10")
    await fake_llm.set_mode(latency=3.0)
    ts = [task(agent) for _ in range(6)]
    ids = {t["task_id"] for t in ts}
    await produce(topics.task_topic(agent), [encode(t) for t in ts])
    await eventually(lambda: sum(1 for r in fake_llm.requests if r.task_id in ids) >= 2, timeout=30,
                     what="two calls in flight")
    in_flight = {r.task_id for r in fake_llm.requests if r.task_id in ids}

    stopping = asyncio.create_task(asyncio.to_thread(w0.terminate, 40.0))
    answers = []
    while not stopping.done():
        answers.append(await _readyz_status(w0.web_port))
        await asyncio.sleep(0.2)
    code, seconds = await stopping
    assert code == 0, w0.tail()
    after = answers[answers.index(503):] if 503 in answers else []
    assert after and 200 not in after, f"/readyz said 503 once stopping began, and never ready again: {answers}"
    seen = set(answers)
    assert seconds < 10 + 5, "no longer than the grace and a commit"
    early = await results_for(in_flight, timeout=10)
    assert {json.loads(m[0].value)["status"] for m in early.values()} == {"succeeded"}, "calls in flight finished"
    called_by_w0 = Counter(r.task_id for r in fake_llm.requests if r.task_id in ids)
    assert set(called_by_w0) == in_flight, "nothing new was started after SIGTERM"
    print(
        f"\nshutdown: exit {code} after {seconds:.1f}s, {len(in_flight)} calls finished, readyz "
        f"{sorted(map(str, seen))}"
    )

    await fake_llm.set_mode(latency=0.0)
    await c.started("w1")
    results = await results_for(ids, timeout=60)
    assert set(results) == ids and all(len(v) == 1 for v in results.values()), \
        "every task once, none twice"
    assert Counter(r.task_id for r in fake_llm.requests if r.task_id in ids) == Counter(ids), "one call per task"
    await all_committed(c.app_id, topics.task_topic(agent))
