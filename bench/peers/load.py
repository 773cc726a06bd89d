"""The workload every system gets, and its four figures; run in the project's venv by bench/peers/run.py.

The workload: N tasks with unique ids (bench.common.task_ids), each one call to the fake LLM over HTTP (its own
process, `python -m agents_stream.testing.fakellm`, as B2 starts it; every request names its task, so the calls per
task are counted from its ``/_admin/requests``), and one stored result. A system is driven through ``System``:
ours and Quix Streams by records on Kafka and their results read off the output topic (bench.common's publisher and
Watch), Temporal, Restate and DBOS by one HTTP request per task that answers once the result is stored (``http_run``).

- (a) tasks/s per worker process, model 200 ms: N published or requested at once (a bounded number of requests open
  for the HTTP ones, more than any worker's slots), timed from the first send to the last result.
- (b) end-to-end overhead p50/p99, model instant: tasks sent at a fixed rate, send to result stamped in this process;
  the first two seconds are warm-up and not counted.
- (c) model calls per task after a SIGKILL: tasks at a fixed rate for 10 s with a 500 ms model (calls in flight),
  the worker SIGKILLed after 5 s and started again at once as its supervisor would (ours: as a StatefulSet pod, the
  same name, data dir, address and static membership id); every task must end with a result; duplicates are the
  calls beyond one per task.
- (d) worker RSS (and peak) after (a), and the peer's own servers (Temporal, Restate, PostgreSQL; Pss summed over
  their processes). The Kafka broker, which ours and Quix Streams share, is not counted.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Protocol

import aiohttp

from bench import common
from bench.b2_provider_latency import fake_llm
from bench.common import percentile, task_body, task_ids

MODEL_S = 0.2
KILL_MODEL_S = 0.5
WARMUP_S = 2.0
#: requests an HTTP driver keeps open in (a): above every worker's own limit, so the worker's limit is what counts
OPEN_REQUESTS = 256


class System(Protocol):
    name: str
    concurrency: str  # the concurrency it runs at, stated in the table
    throughput_n: int | None  # N for (a) when the default would take too long (Quix Streams: one at a time)

    async def start(self, tmp: Path, llm_url: str) -> None: ...
    async def run_tasks(self, ids: list[str], rate: float | None, timeout: float) -> tuple[dict, dict]: ...
    def worker_pid(self) -> int: ...
    def server_pids(self) -> list[int]: ...
    async def kill_and_restart(self) -> None: ...
    async def stop(self) -> None: ...


@dataclass
class Sizes:
    n: int = 1000  # (a)
    rate: float = 20.0  # (b), tasks/s: one every peer keeps up with (Temporal's dev server does 10-30 here)
    seconds: float = 10.0  # (b), counted
    kill_rate: float = 20.0  # (c), at most
    kill_seconds: float = 10.0  # (c), the kill halfway


# -- the fake LLM ----------------------------------------------------------------------


async def set_latency(url: str, seconds: float) -> None:
    async with aiohttp.ClientSession() as http, http.post(f"{url}/_admin/mode", json={"latency": seconds}) as r:
        r.raise_for_status()


async def calls_per_task(url: str) -> Counter:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/_admin/requests",
                                                         timeout=aiohttp.ClientTimeout(total=60)) as r:
        return Counter(req.get("task_id") for req in await r.json())


# -- an HTTP driver --------------------------------------------------------------------

Post = Callable[[aiohttp.ClientSession, str, bytes], Awaitable[None]]


def task_gateway(port: int) -> Post:
    """``post`` for ``http_run`` to a bench app's own gateway (DBOS's, Temporal's): ``POST /task/<id>`` with the
    task's body, answered once its result is stored."""

    async def post(http: aiohttp.ClientSession, task_id: str, body: bytes) -> None:
        async with http.post(f"http://127.0.0.1:{port}/task/{task_id}", data=body) as r:
            r.raise_for_status()

    return post

async def http_run(post: Post, ids: list[str], rate: float | None, timeout: float,
                   limit: int = OPEN_REQUESTS) -> tuple[dict[str, float], dict[str, float]]:
    """One request per task (``post`` returns once the result is stored, raises on failure and is then tried
    again, as a client of a durable service would): all at once with ``limit`` open, or ``rate`` per second.
    Returns the monotonic times each task was first sent and got its answer."""
    sent: dict[str, float] = {}
    done: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    gate = asyncio.Semaphore(limit if rate is None else 100_000)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=None, sock_connect=5)) as http:

        async def one(i: int, task_id: str) -> None:
            async with gate:
                sent[task_id] = time.monotonic()
                while time.monotonic() < deadline:
                    try:
                        await post(http, task_id, task_body("bench", task_id, i))
                        done[task_id] = time.monotonic()
                        return
                    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                        await asyncio.sleep(0.2)

        tasks: list[asyncio.Task] = []
        if rate is None:
            tasks = [asyncio.ensure_future(one(i, t)) for i, t in enumerate(ids)]
        else:  # as bench.common.publish_paced: ticks of 10 ms
            start = time.monotonic()
            while len(tasks) < len(ids):
                due = min(len(ids), int((time.monotonic() - start) * rate) + 1)
                tasks += [asyncio.ensure_future(one(i, ids[i])) for i in range(len(tasks), due)]
                await asyncio.sleep(0.01)
        _, pending = await asyncio.wait(tasks, timeout=max(1.0, deadline - time.monotonic()))
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return sent, done


# -- the four figures --------------------------------------------------------------------


def server_pss(pids: list[int]) -> int:
    """Pss (bytes) of these processes and all their descendants (PostgreSQL's backends share memory: Pss, not RSS)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    total, todo = 0, list(pids)
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


async def throughput(system: System, n: int) -> dict[str, Any]:
    ids = task_ids("peers-a", n)
    pid = system.worker_pid()
    cpu0 = common.cpu_seconds(pid)
    sent, done = await system.run_tasks(ids, None, timeout=60 + n / 5)
    cpu = common.cpu_seconds(pid) - cpu0
    took = max(done.values()) - min(sent.values()) if done else float("nan")
    mem = common.proc_status(pid)
    return {"n": n, "done": len(done), "seconds": took, "rate": len(done) / took if done else 0.0,
            "cpu_ms_per_task": cpu * 1000 / max(1, len(done)), "cpu_cores": cpu / took if done else 0.0,
            "rss_mb": mem["VmRSS"] / 2**20, "rss_peak_mb": mem["VmHWM"] / 2**20,
            "server_mb": server_pss(system.server_pids()) / 2**20 if system.server_pids() else None}


async def latency(system: System, rate: float, seconds: float) -> dict[str, Any]:
    ids = task_ids("peers-b", int(rate * (seconds + WARMUP_S)))
    sent, done = await system.run_tasks(ids, rate, timeout=seconds + WARMUP_S + 60)
    first = min(sent.values())
    counted = [i for i in ids if i in sent and sent[i] - first >= WARMUP_S]
    lat = [(done[i] - sent[i]) * 1000 for i in counted if i in done]
    return {"rate": rate, "n": len(counted), "done": len(lat), "p50_ms": percentile(lat, 50),
            "p99_ms": percentile(lat, 99), "max_ms": max(lat, default=float("nan"))}


async def kill(system: System, url: str, rate: float, seconds: float) -> dict[str, Any]:
    ids = task_ids("peers-c", max(10, int(rate * seconds)))
    run = asyncio.ensure_future(system.run_tasks(ids, rate, timeout=seconds + 150))
    try:
        await asyncio.sleep(seconds / 2)
        t_kill = time.monotonic()
        await system.kill_and_restart()
        sent, done = await run
    finally:
        run.cancel()
    calls = await calls_per_task(url)
    per_task = [calls.get(i, 0) for i in ids]
    missing = [i for i in ids if i not in done]
    return {"rate": rate, "n": len(ids), "calls": sum(per_task), "duplicates": sum(max(0, c - 1) for c in per_task),
            "tasks_called_twice": sum(1 for c in per_task if c > 1), "without_result": len(missing),
            "never_called": sum(1 for c in per_task if c == 0), "calls_per_task": sum(per_task) / len(ids),
            "last_result_after_kill_s": max(done.values(), default=t_kill) - t_kill}


def kill_rate(sizes: Sizes, rate_a: float) -> float:
    """(c)'s rate: ``sizes.kill_rate``, or 80% of what the system did in (a) scaled to the slower model."""
    return round(min(sizes.kill_rate, 0.8 * rate_a * MODEL_S / KILL_MODEL_S), 1)


async def measure(system: System, tmp: Path, sizes: Sizes) -> dict[str, Any]:
    """All four figures for one system; a phase that fails is recorded as an error and the next still runs."""
    res: dict[str, Any] = {"name": system.name, "concurrency": system.concurrency}
    proc, url = await fake_llm(tmp, MODEL_S)
    try:
        started = time.monotonic()
        await system.start(tmp, url)
        await system.run_tasks(task_ids("peers-warm", 20), None, timeout=120)  # warm: every path taken once
        res["start_s"] = time.monotonic() - started
        for key, phase in (
            ("a", lambda: throughput(system, system.throughput_n or sizes.n)),
            ("b", lambda: latency(system, sizes.rate, sizes.seconds)),
            ("c", lambda: kill(system, url, kill_rate(sizes, res.get("a", {}).get("rate", 5.0)), sizes.kill_seconds)),
        ):
            await set_latency(url, {"a": MODEL_S, "b": 0.0, "c": KILL_MODEL_S}[key])
            try:
                res[key] = await phase()
            except Exception as exc:  # noqa: BLE001 (recorded in the table; the next phase still runs)
                res[f"{key}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            print(f"    {system.name} ({key}): {res.get(key) or res.get(f'{key}_error')}", flush=True)
    finally:
        try:
            await system.stop()
        finally:
            common.stop(proc)
    return res
