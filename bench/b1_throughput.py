"""B1: end-to-end tasks/s of one worker with the instant `local` provider, next to three baselines on the
same broker and payloads: a bare Faust passthrough, a raw aiokafka consume→produce loop, and a bare Faust
app of the worker's shape (two hops through one table-owning agent, a table write at each).

Each flow is measured the same way: publish N tasks as fast as the client goes, time from the first send
until the last output record is on the output topic (publishing included, the flow already running and
warmed up: one record per partition went through before the clock starts).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from bench import common
from bench.common import (
    Watch,
    base_env,
    create_topics,
    flow_ready,
    publish_all,
    spawn,
    stop,
    task_ids,
    unique,
)
from bench.report import Row, rate, ratio


async def _measure(in_topic: str, out: Watch, agent: str, n: int, pid: int | None = None) -> dict[str, Any]:
    """Publish n, wait for all n outputs; with ``pid``, also the CPU that process used meanwhile."""
    ids = task_ids("b1", n)
    cpu0 = common.cpu_seconds(pid) if pid else 0.0
    started = await publish_all(in_topic, agent, ids)
    done = await out.wait_all(ids, timeout=60 + n / 50)
    cpu = common.cpu_seconds(pid) - cpu0 if pid else float("nan")
    arrived = [out.seen[i] for i in ids if i in out.seen]
    took = (max(arrived) - started) if arrived else float("nan")
    return {"n": n, "done": len(arrived), "seconds": took, "rate": len(arrived) / took if arrived else 0.0,
            "complete": done, "cpu_s": cpu, "cpu_ms_per_task": cpu * 1000 / max(1, len(arrived)),
            "cpu_cores": cpu / took if arrived else 0.0}


def _value(r: dict[str, Any]) -> str:
    return f"{rate(r['rate'])} (process CPU {r['cpu_cores']:.2f} cores, {r['cpu_ms_per_task']:.2f} ms/task)"


async def ours(tmp: Path, n: int, **settings: str) -> dict[str, Any]:
    """With BENCH_PYSPY=<path of py-spy> the worker is sampled during the measurement (collapsed stacks,
    written to BENCH_PROFILE_OUT or <tmp>/b1-ours.pyspy)."""
    async with common.one_worker(tmp, "b1", **settings) as flow:
        pid = flow.worker.proc.pid
        spy = None
        if os.environ.get("BENCH_PYSPY"):
            target = os.environ.get("BENCH_PROFILE_OUT") or str(tmp / "b1-ours.pyspy")
            spy = spawn([os.environ["BENCH_PYSPY"], "record", "--format", "raw", "--rate", "200", "-p", str(pid),
                         "-o", target], base_env(), tmp / "py-spy.log")
            await asyncio.sleep(1.0)
        try:
            result = await _measure(flow.topic, flow.out, flow.agent, n, pid)
        finally:
            stop(spy, signal.SIGINT)
        result["pid"] = pid
        return result


async def _external(tmp: Path, n: int, name: str, args: list[str], env: dict[str, str],
                    topics: list[str]) -> dict[str, Any]:
    await create_topics(topics)
    log = tmp / f"{name}.log"
    proc = spawn(args, env, log)
    out = Watch(topics[1])
    try:
        await out.start()
        await flow_ready(topics[0], out, "bench")
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}")
        return await _measure(topics[0], out, "bench", n, proc.pid)
    except Exception:
        print(common.tail(log), file=sys.stderr)
        raise
    finally:
        await out.stop()
        stop(proc)


async def faust_app(tmp: Path, n: int, mode: str) -> dict[str, Any]:
    run = unique(f"bench-faust-{mode}")
    topics = [f"{run}.in", f"{run}.out"] + ([f"{run}.mid"] if mode == "shaped" else [])
    env = base_env(
        BENCH_MODE=mode, BENCH_IN=topics[0], BENCH_OUT=topics[1], BENCH_MID=topics[2] if mode == "shaped" else "",
        BENCH_APP_ID=run, BENCH_DATA_DIR=str(tmp / f"data-{run}"), BENCH_PARTITIONS=str(common.PARTITIONS),
    )
    args = [sys.executable, "-m", "faust", "-A", "bench.faust_baseline", "worker", "-l", "warn"]
    return await _external(tmp, n, run, args, env, topics)


async def aiokafka_loop(tmp: Path, n: int) -> dict[str, Any]:
    run = unique("bench-aiokafka")
    topics = [f"{run}.in", f"{run}.out"]
    args = [sys.executable, str(common.ROOT / "bench" / "aiokafka_baseline.py"), common.BOOTSTRAP, topics[0],
            topics[1], run]
    return await _external(tmp, n, run, args, base_env(), topics)


async def run(tmp: Path, n: int) -> tuple[list[Row], dict[str, Any]]:
    res = {
        "ours": await ours(tmp, n),
        "faust_passthrough": await faust_app(tmp, n, "passthrough"),
        "aiokafka": await aiokafka_loop(tmp, n),
        "faust_shaped": await faust_app(tmp, n, "shaped"),
    }
    o = res["ours"]["rate"]
    rows = [Row("B1", f"agents-stream, 1 worker, local provider (N={n:,})", _value(res["ours"]),
                "≥ 1,000 tasks/s", o >= 1000)]
    labels = {
        "faust_passthrough": "bare Faust passthrough (1 hop)",
        "aiokafka": "raw aiokafka consume→produce loop",
        "faust_shaped": "bare Faust, same shape (2 hops, table write per hop)",
    }
    for key, label in labels.items():
        r = res[key]["rate"]
        rows.append(Row("B1", label, _value(res[key])))
        target, met = ("≥ 130%", ratio(o, r) >= 1.3) if key == "faust_shaped" else ("", None)
        rows.append(Row("B1", f"  ratio ours / {label.split(' (')[0]}", f"{ratio(o, r):.0%}", target, met))
    for key, r in res.items():
        if not r["complete"]:
            rows.append(Row("B1", f"  {key}: INCOMPLETE", f"{r['done']}/{r['n']} outputs before the timeout"))
    return rows, res


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        rows, _ = asyncio.run(run(Path(d), int(sys.argv[1]) if len(sys.argv) > 1 else 2000))
        print(*(f"{r.metric}: {r.value} {r.target} {r.verdict}" for r in rows), sep="\n")
