"""`make bench-peers`: the same workload on agents-stream and on Temporal, Restate, DBOS and Quix Streams, one run,
one table (printed, and written into docs/benchmarks.md between its peers markers).

    .venv/bin/python -m bench.peers.run [--only ours,ours-256,temporal,temporal-memory,restate,restate-64,dbos,quix]
        [--no-write] [--no-install] [--n 1000] [--rate 20] [--seconds 10]

Installs the peers first (bench/peers/install.py, cached under .data/peers/). Needs a broker for ours and Quix
Streams: KAFKA_BOOTSTRAP (host:port) or KAFKA_BROKER, default 127.0.0.1:9092. A peer that cannot be installed or
run gets a row saying why; the others still run. Every process is stopped by PID whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import os
import signal
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
if not os.environ.get("KAFKA_BOOTSTRAP") and os.environ.get("KAFKA_BROKER"):
    from agents_stream.settings import bootstrap_servers

    os.environ["KAFKA_BOOTSTRAP"] = bootstrap_servers(os.environ["KAFKA_BROKER"])

from bench import common  # noqa: E402
from bench.peers import install, load, versions  # noqa: E402
from bench.peers.dbos_peer import Dbos  # noqa: E402
from bench.peers.ours import Ours  # noqa: E402
from bench.peers.quix_peer import Quix  # noqa: E402
from bench.peers.restate_peer import Restate  # noqa: E402
from bench.peers.table import markdown, text  # noqa: E402
from bench.peers.temporal_peer import Temporal  # noqa: E402

SYSTEMS: dict[str, Callable[[], Any]] = {
    "ours": Ours,
    "ours-256": lambda: Ours(AGENTS_STREAM_MAX_IN_FLIGHT="256"),  # as many open calls as the HTTP peers get
    "temporal": Temporal,
    "temporal-memory": lambda: Temporal(on_disk=False),
    "restate": Restate,
    "restate-64": lambda: Restate(open_requests=64),  # the concurrency of ours with its default 64 call slots
    "dbos": Dbos,
    "quix": Quix,
}
LIMIT_S = 360  # one system's whole measurement, start to stop
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- peers:begin -->", "<!-- peers:end -->"


async def main(only: list[str], sizes: load.Sizes, ready: dict[str, str | None]) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="agents-stream-peers-") as d:
        for name in only:
            system = SYSTEMS[name]()
            if ready.get(name):
                results[name] = {"name": system.name, "error": f"not installed: {ready[name]}"}
                continue
            print(f"[{time.strftime('%H:%M:%S')}] {system.name} ...", flush=True)
            started = time.monotonic()
            try:
                results[name] = await asyncio.wait_for(load.measure(system, Path(d), sizes), LIMIT_S)
            except asyncio.TimeoutError:
                results[name] = {"name": system.name, "error": f"not measured: over {LIMIT_S} s"}
            except Exception as exc:  # noqa: BLE001 (its row says why; the next system still runs)
                traceback.print_exc()
                results[name] = {"name": system.name, "error": f"{type(exc).__name__}: {str(exc)[:160]}"}
            finally:
                common.stop_all()
            results[name]["took_s"] = time.monotonic() - started
            print(f"[{time.strftime('%H:%M:%S')}] {system.name} done in {results[name]['took_s']:.0f}s", flush=True)
    return results


def section(results: dict[str, dict[str, Any]], sizes: load.Sizes, load_avg: tuple[str, str]) -> list[str]:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    took = sum(r.get("took_s", 0.0) for r in results.values())
    return [
        BEGIN, "## Peers (`make bench-peers`)", "",
        f"Written by `make bench-peers` (`bench/peers/run.py`); do not edit by hand. Run: {when}, {took:.0f} s, "
        f"load average {load_avg[0]} at the start and {load_avg[1]} at the end (2 cores: the worker, its server, "
        "the fake LLM, the broker and the driver all share them, so compare within one run).", "",
        f"Versions: Temporal CLI {versions.TEMPORAL_CLI[1]} (`temporal server start-dev`, SQLite in a file, or in "
        f"memory, its default), temporalio 1.35.0; Restate server {versions.RESTATE_SERVER[1]}, restate-sdk 1.2.0 "
        "on hypercorn 0.18.0; dbos 3.4.0 on PostgreSQL 15 (Debian); quixstreams 3.28.1 (pins: "
        "bench/peers/versions.py, requirements.txt).", "",
        f"Sizes: (a) N={sizes.n:,} (Temporal {Temporal.throughput_n}, Quix Streams {Quix.throughput_n}), "
        f"(b) {sizes.rate:g} tasks/s for {sizes.seconds:g} s after {load.WARMUP_S:g} s of warm-up, "
        f"(c) up to {sizes.kill_rate:g} tasks/s for {sizes.kill_seconds:g} s, a {load.KILL_MODEL_S * 1000:.0f} ms "
        "model, the SIGKILL halfway.", "",
        *markdown(results, sizes), "",
        *equal_concurrency(results), "",
        *(load.__doc__ or "").strip().splitlines(), END,
    ]


#: agents-stream against Restate at equal concurrency: (ours, Restate) per bound
EQUAL = {"64": ("ours", "restate-64"), "256": ("ours-256", "restate")}


def equal_concurrency(results: dict[str, dict[str, Any]]) -> list[str]:
    """The target at equal concurrency: ours ≥ 1.2× Restate's tasks/s in (a), and CPU per task ≤ Restate's."""
    out = ["At equal concurrency (call slots / open requests), target: tasks/s ≥ 1.2× Restate's and worker CPU per "
           "task ≤ Restate's (its service process; its server's CPU not counted):", ""]
    for bound, (ours_key, peer_key) in EQUAL.items():
        ours, peer = results.get(ours_key, {}).get("a"), results.get(peer_key, {}).get("a")
        if not ours or not peer:
            out.append(f"- {bound}: not measured")
            continue
        speed, cpu = ours["rate"] / peer["rate"], (ours["cpu_ms_per_task"], peer["cpu_ms_per_task"])
        out.append(f"- {bound}: {ours['rate']:.1f} against {peer['rate']:.1f} tasks/s, {speed:.2f}× "
                   f"({'met' if speed >= 1.2 else 'MISSED'}); CPU {cpu[0]:.2f} against {cpu[1]:.2f} ms a task "
                   f"({'met' if cpu[0] <= cpu[1] else 'MISSED'})")
    return out


def write_section(lines: list[str]) -> None:
    """Replace the peers section of docs/benchmarks.md, or append it."""
    doc = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    block = "\n".join(lines)
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        doc = head + block + rest.split(END, 1)[1]
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    DOC.write_text(doc)


def cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(SYSTEMS), help=f"comma-separated subset of {', '.join(SYSTEMS)}")
    parser.add_argument("--n", type=int, default=load.Sizes.n, help="tasks in (a)")
    parser.add_argument("--rate", type=float, default=load.Sizes.rate, help="tasks/s in (b)")
    parser.add_argument("--seconds", type=float, default=load.Sizes.seconds, help="seconds counted in (b)")
    parser.add_argument("--no-install", action="store_true", help="use what .data/peers/ has; install nothing")
    parser.add_argument("--no-write", action="store_true", help=f"print only; leave {DOC.relative_to(ROOT)} alone")
    args = parser.parse_args()
    only = [x.strip().lower() for x in args.only.split(",") if x.strip()]
    if unknown := [x for x in only if x not in SYSTEMS]:
        parser.error(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    atexit.register(common.stop_all)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: every finally stops its processes
    ready: dict[str, str | None] = {}
    if not args.no_install:
        print(f"[{time.strftime('%H:%M:%S')}] installing the peers into {versions.PEERS.relative_to(ROOT)}/ "
              "(cached; the first time takes minutes) ...", flush=True)
        ready = install.all_peers()
        for name, why in ready.items():
            print(f"    {name}: {why or 'ready'}", flush=True)
    sizes = load.Sizes(n=args.n, rate=args.rate, seconds=args.seconds)
    load_start = f"{os.getloadavg()[0]:.2f}"
    results = asyncio.run(main(only, sizes, ready))
    lines = section(results, sizes, (load_start, f"{os.getloadavg()[0]:.2f}"))
    print("\n" + "\n".join(text(results, sizes) + ["", *equal_concurrency(results)]))
    if not args.no_write:
        write_section(lines)
        print(f"\nwritten: {DOC.relative_to(ROOT)} (the peers section)")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli())
