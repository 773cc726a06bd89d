"""B2: tasks/s per worker when every provider call takes 200 ms (the fake LLM server over HTTP, in its own
process), next to the classic synchronous worker (read one message, call the API, send the result, commit),
and an agent loop of three such calls and two tool calls per task (bench/agent_loop.py).

The worker runs with its default call slots (AGENTS_STREAM_MAX_IN_FLIGHT=64), so its ceiling is
64 / 0.2 s = 320 tasks/s; the synchronous worker's is 1 / 0.2 s = 5 tasks/s.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from pathlib import Path
from typing import Any

from bench import common
from bench.b1_throughput import _external, _measure, _value
from bench.common import base_env, spawn, stop, unique
from bench.report import Row, ratio

LATENCY_S = 0.2


async def fake_llm(tmp: Path, latency: float) -> tuple[Any, str]:
    """The fake LLM server in a process of its own; returns (process, base URL)."""
    return await fake_llm_with(tmp, latency, [])


async def fake_llm_with(tmp: Path, latency: float, options: list[str]) -> tuple[Any, str]:
    """The fake LLM server with more command-line ``options``, in a process of its own; (process, base URL)."""
    log = tmp / f"fake-llm-{len(list(tmp.glob('fake-llm*.log')))}.log"
    proc = spawn([sys.executable, "-m", "agents_stream.testing.fakellm", "--port", "0", "--latency", str(latency),
                  *options], base_env(), log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = re.search(r"fake LLM listening on (http://\S+)", common.tail(log, 200))
        if m:
            return proc, m.group(1)
        if proc.poll() is not None:
            break
        await asyncio.sleep(0.2)
    stop(proc)
    raise RuntimeError(f"fake LLM did not start:\n{common.tail(log)}")


async def fake_admin(url: str, path: str, timeout: float = 30) -> Any:
    """The JSON of one of the fake LLM's admin pages (``/_admin/<path>``)."""
    import aiohttp

    async with aiohttp.ClientSession() as http, http.get(f"{url}/_admin/{path}",
                                                         timeout=aiohttp.ClientTimeout(total=timeout)) as r:
        return await r.json()


async def _stats(url: str) -> dict[str, Any]:
    """The fake's own counters: peak_in_flight shows how many of the worker's call slots were really busy."""
    return await fake_admin(url, "stats", timeout=5)


async def ours(tmp: Path, n: int, url: str) -> dict[str, Any]:
    async with common.one_worker(tmp, "b2", url) as flow:
        return await _measure(flow.topic, flow.out, flow.agent, n, flow.worker.proc.pid)


async def sync_worker(tmp: Path, n: int, url: str) -> dict[str, Any]:
    run = unique("bench-sync")
    topics = [f"{run}.in", f"{run}.out"]
    args = [sys.executable, str(common.ROOT / "bench" / "sync_worker.py"), common.BOOTSTRAP, topics[0],
            topics[1], run, url]
    return await _external(tmp, n, run, args, base_env(), topics)


async def run(tmp: Path, n: int, n_sync: int, n_agent: int = 0) -> tuple[list[Row], dict[str, Any]]:
    """B2, and with ``n_agent`` the agent-loop figure beside it (bench/agent_loop.py)."""
    proc, url = await fake_llm(tmp, LATENCY_S)
    try:
        cpu0 = common.cpu_seconds(proc.pid)
        res = {"ours": await ours(tmp, n, url)}
        res["fake_llm"] = {"cpu_s": common.cpu_seconds(proc.pid) - cpu0, **await _stats(url)}
        res["sync"] = await sync_worker(tmp, n_sync, url)
    finally:
        stop(proc)
    o, s = res["ours"]["rate"], res["sync"]["rate"]
    rows = [
        Row("B2", f"agents-stream, 1 worker, provider 200 ms over HTTP (N={n:,})", _value(res["ours"]),
            "≥ 300 tasks/s (94% of the 320 ceiling)", o >= 300),
        Row("B2", "  provider calls in flight at once (peak, seen by the fake LLM)",
            f"{res['fake_llm'].get('peak_in_flight')} of 64 slots"),
        Row("B2", f"synchronous one-at-a-time worker (N={n_sync})", f"{s:,.1f} tasks/s"),
        Row("B2", "  ratio ours / synchronous", f"{ratio(o, s):,.0f}×", "≥ 50×", ratio(o, s) >= 50),
    ]
    for key, r in res.items():
        if "complete" in r and not r["complete"]:
            rows.append(Row("B2", f"  {key}: INCOMPLETE", f"{r['done']}/{r['n']} outputs before the timeout"))
    if n_agent:
        from bench import agent_loop  # it imports this module's fake_llm_with

        agent_rows, res["agent"] = await agent_loop.run(tmp, n_agent, 20)
        rows += agent_rows
        rows.append(Row("B2", "  ratio agent tasks / one-call tasks (3 model calls each)",
                        f"{ratio(res['agent']['rate'], o):.2f}×", "≥ 0.25× (a third, less the journal's cost)",
                        ratio(res["agent"]["rate"], o) >= 0.25))
    return rows, res
