"""B2's agent figure: one worker running a 3-turn agent with 2 tool calls per task, every model call 200 ms.

Each task is `bench/agent_def.py`'s agent: turn 0 calls `fetch`, turn 1 calls `store`, turn 2 answers (the fake
LLM's `--tool-turns fetch,store`). Each turn is journaled (a JournalEntry confirmed by the broker) before its calls
run, each tool result before the next entry (the next turn is asked meanwhile), so a task makes 3 model calls and 5
journal writes. Throughput: N tasks published at once.
Overhead per turn: tasks published one at a time; (median task latency − 3 × 200 ms) / 3: it carries the task's
intake and its result too. A durable step (one entry journaled and confirmed) is read from the worker's
agents_stream_journal_durable_seconds over the same tasks, and printed beside its baseline: one record sent and
confirmed by a bare aiokafka producer (acks=all, idempotent, no linger) on the same broker, in the same run.

Where a turn's overhead goes, from the times the fake LLM received each call of the same tasks (its
``/_admin/requests``; the driver's and the fake's clocks are one host's wall clock): the task's intake (published →
first model call: the lease written and confirmed, the prompt built), between two calls (the answer parsed, the turn
journaled, the tool run, its result journaled, the next prompt built), and after the last call (the final turn
journaled, the finished record confirmed, the result sent and read by the driver). The model's HTTP exchange beyond
the fake's 200 ms wait is inside the last two.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import common
from bench.b1_throughput import _measure, _value
from bench.b2_provider_latency import LATENCY_S, fake_admin, fake_llm_with
from bench.common import produce_round_trip_s, publish_each, task_ids
from bench.report import Row

TURNS = 3


def config(url: str) -> Any:
    def toml(agent: str) -> str:
        return (f'[providers.fake]\nkind = "openai"\nbase_url = "{url}/v1"\nmodel = "fake-model"\ntimeout_s = 10\n\n'
                f'[agents.{agent}]\nproviders = ["fake"]\nagent = "bench.agent_def:BENCH"\n')
    return toml


async def run(tmp: Path, n: int, n_seq: int) -> tuple[list[Row], dict[str, Any]]:
    proc, url = await fake_llm_with(tmp, LATENCY_S, ["--tool-turns", "fetch,store"])
    try:
        async with common.one_worker(tmp, "b2agent", url, toml=config(url)) as flow:
            res = await _measure(flow.topic, flow.out, flow.agent, n, flow.worker.proc.pid)
            steps_before = await durable_steps(flow.worker)

            async def answered(task_id: str) -> None:
                if not await flow.out.wait_all([task_id], timeout=30):
                    raise RuntimeError(f"agent task {task_id} unanswered in 30 s:\n{flow.worker.tail()}")

            sent = await publish_each(flow.topic, flow.agent, task_ids("b2seq", n_seq), answered)
            latencies = [flow.out.seen[task_id] - at for task_id, at in sent.items()]
            steps_after = await durable_steps(flow.worker)
            wall = time.time() - time.monotonic()  # the fake stamps calls with the wall clock
            calls = await calls_received(url)
            phases = turn_phases({t: (at + wall, flow.out.seen[t] + wall) for t, at in sent.items()}, calls)
        bare_s = await produce_round_trip_s()
    finally:
        common.stop(proc)
    median = statistics.median(latencies)
    res["sequential"] = {"n": n_seq, "median_s": median, "p90_s": sorted(latencies)[int(0.9 * (n_seq - 1))]}
    overhead_ms = (median - TURNS * LATENCY_S) * 1000 / TURNS
    res["overhead_ms_per_turn"] = overhead_ms
    steps = steps_after[0] - steps_before[0]
    step_ms = (steps_after[1] - steps_before[1]) * 1000 / steps if steps else float("nan")
    res["durable_step_ms"] = step_ms
    res["bare_round_trip_ms"] = bare_s * 1000
    res["turn_phases_ms"] = phases
    rows = [
        Row("B2", f"agent loop, 1 worker: 3 turns + 2 tool calls per task, model 200 ms (N={n:,})", _value(res),
            f"ceiling 64 slots / {TURNS * LATENCY_S:.1f} s = {64 / (TURNS * LATENCY_S):.0f} tasks/s"),
        Row("B2", f"  overhead per turn (tasks one at a time, N={n_seq}: median {median * 1000:.0f} ms a task)",
            f"{overhead_ms:.1f} ms", "≤ 5 ms", overhead_ms <= 5),
        Row("B2", "    by phase (medians): task in → first call; between two calls; last call → result seen",
            f"{phases['intake']:.1f} / {phases['between']:.1f} / {phases['after']:.1f} ms",
            "overhead per turn × 3 ≈ first + 2 × between + last"),
        Row("B2", f"  a durable step: an entry journaled and confirmed (same tasks, mean of {steps:.0f}; /metrics)",
            f"{step_ms:.1f} ms", "≤ 5 ms", step_ms <= 5),
        Row("B2", "    baseline: one record confirmed by a bare aiokafka producer (acks=all, same broker and run)",
            f"{bare_s * 1000:.2f} ms (the step: x{step_ms / (bare_s * 1000):.1f})"),
    ]
    if not res["complete"]:
        rows.append(Row("B2", "  agent loop: INCOMPLETE", f"{res['done']}/{res['n']} outputs before the timeout"))
    return rows, res


async def calls_received(url: str) -> list[dict[str, Any]]:
    """Every call the fake LLM received (task id, wall-clock time), from its ``/_admin/requests``."""
    return [{"task_id": c["task_id"], "ts": c["ts"]} for c in await fake_admin(url, "requests")]


def turn_phases(tasks: dict[str, tuple[float, float]], calls: list[dict[str, Any]]) -> dict[str, float]:
    """Medians in ms over ``tasks`` (task id → (published, result seen), wall clock) of: published → first model
    call received; the gap between two calls beyond the model's wait; the last call's wait's end → result seen."""
    received: dict[str, list[float]] = {}
    for call in calls:
        if call["task_id"] in tasks:
            received.setdefault(call["task_id"], []).append(call["ts"])
    intake, between, after = [], [], []
    for task_id, (published, seen) in tasks.items():
        times = sorted(received.get(task_id, ()))
        if len(times) != TURNS:
            raise RuntimeError(f"task {task_id}: the fake LLM received {len(times)} calls, not {TURNS}")
        intake.append(times[0] - published)
        between += [later - earlier - LATENCY_S for earlier, later in zip(times, times[1:], strict=False)]
        after.append(seen - times[-1] - LATENCY_S)
    return {name: statistics.median(values) * 1000
            for name, values in (("intake", intake), ("between", between), ("after", after))}


async def durable_steps(worker: Any) -> tuple[float, float]:
    """(count, sum in seconds) of the worker's durable steps so far, read from its /metrics."""
    text = await worker.get("/metrics")
    found = dict(re.findall(r"^agents_stream_journal_durable_seconds_(count|sum) (\S+)$", text, re.M))
    return float(found.get("count", 0)), float(found.get("sum", 0))


if __name__ == "__main__":  # a run of its own: python -m bench.agent_loop [N]
    import tempfile

    from bench.report import table

    async def main() -> None:
        with tempfile.TemporaryDirectory(prefix="agents-stream-bench-") as d:
            started = time.monotonic()
            rows, _ = await run(Path(d), int(sys.argv[1]) if len(sys.argv) > 1 else 1000, 20)
            print("\n".join(table(rows)))
            print(f"took {time.monotonic() - started:.0f} s")

    asyncio.run(main())
