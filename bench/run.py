"""`make bench`: run the benchmarks (all, or `--only B1,B3`), print the table, write docs/benchmarks.md.

    .venv/bin/python bench/run.py [--quick] [--only B1,B3 [--merge]] [--no-write]

Needs a broker: KAFKA_BOOTSTRAP (host:port) or KAFKA_BROKER (kafka://host:port), default 127.0.0.1:9092.
Every benchmark has a timeout and stops the processes it started (by PID) whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if not os.environ.get("KAFKA_BOOTSTRAP") and os.environ.get("KAFKA_BROKER"):
    from agents_stream.settings import bootstrap_servers

    os.environ["KAFKA_BOOTSTRAP"] = bootstrap_servers(os.environ["KAFKA_BROKER"])

from bench import (  # noqa: E402
    b1_throughput,
    b2_provider_latency,
    b3_latency,
    b4_failover,
    b5_memory,
    b6_failover_state,
    b7_conversation,
    b8_desk,
    common,
)
from bench.report import Row, markdown, table  # noqa: E402

#: sizes: full (the documented run) and --quick (a smoke run on a busy machine)
SIZES = {
    "full": {"b1_n": 10_000, "b2_n": 5_000, "b2_sync_n": 50, "b2_agent_n": 2_000, "b3_s": 30.0, "b3_probe_s": 60.0,
             "b4_rate": 80.0, "b4_before_s": 15.0, "b4_after_s": 90.0, "b5_n": 1_000_000, "b6_n": 1_000_000,
             "b7_long": 1_000, "b7_burst": 1_000, "b8_repeats": 3},
    "quick": {"b1_n": 2_000, "b2_n": 1_000, "b2_sync_n": 15, "b2_agent_n": 300, "b3_s": 8.0, "b3_probe_s": 10.0,
              "b4_rate": 40.0, "b4_before_s": 10.0, "b4_after_s": 75.0, "b5_n": 50_000, "b6_n": 50_000,
              "b7_long": 100, "b7_burst": 200, "b8_repeats": 1},
}
#: each benchmark's own time limit (seconds), full / quick
TIMEOUTS = {"B1": (900, 300), "B2": (300, 180), "B3": (900, 300), "B4": (360, 300), "B5": (1500, 300),
            "B6": (2400, 600), "B7": (600, 240), "B8": (600, 300)}
MODULES = {"B1": b1_throughput, "B2": b2_provider_latency, "B3": b3_latency, "B4": b4_failover, "B5": b5_memory,
           "B6": b6_failover_state, "B7": b7_conversation,
           "B8": b8_desk}
DOC = ROOT / "docs" / "benchmarks.md"
NOTES = ROOT / "bench" / "notes.md"
PEERS_BEGIN, PEERS_END = "<!-- peers:begin -->", "<!-- peers:end -->"  # bench/peers/run.py's section of DOC


async def main(only: list[str], quick: bool, b3_rate: float | None) -> tuple[list[Row], dict, dict[str, float]]:
    size = SIZES["quick" if quick else "full"]
    rows: list[Row] = []
    raw: dict = {}
    took: dict[str, float] = {}
    keep = os.environ.get("BENCH_KEEP_TMP")  # set: worker logs and data dirs stay (for a post-mortem)
    with (contextlib.nullcontext(tempfile.mkdtemp(prefix="agents-stream-bench-")) if keep
          else tempfile.TemporaryDirectory(prefix="agents-stream-bench-")) as d:
        tmp = Path(d)
        if keep:
            print(f"keeping logs and data under {tmp}", flush=True)
        for name in only:
            limit = TIMEOUTS[name][1 if quick else 0]
            if name == "B1":
                coro = b1_throughput.run(tmp, size["b1_n"])
            elif name == "B2":
                coro = b2_provider_latency.run(tmp, size["b2_n"], size["b2_sync_n"], size["b2_agent_n"])
            elif name == "B3":
                b1 = raw.get("B1", {}).get("ours", {}).get("rate")
                coro = b3_latency.run(tmp, b1 or 500.0, size["b3_s"], size["b3_probe_s"], rate=b3_rate)
            elif name == "B4":
                coro = b4_failover.run(tmp, size["b4_rate"], size["b4_before_s"], size["b4_after_s"])
            elif name == "B5":
                coro = b5_memory.run(tmp, size["b5_n"])
            elif name == "B7":
                coro = b7_conversation.run(tmp, size["b7_long"], size["b7_burst"])
            elif name == "B8":
                coro = b8_desk.run(tmp, size["b8_repeats"])
            else:
                coro = b6_failover_state.run(tmp, size["b6_n"])
            print(f"[{time.strftime('%H:%M:%S')}] {name} ...", flush=True)
            started = time.monotonic()
            try:
                got, raw[name] = await asyncio.wait_for(coro, limit)
                rows += got
            except asyncio.TimeoutError:
                rows.append(Row(name, f"TIMEOUT after {limit}s", "not measured"))
            except Exception as exc:
                traceback.print_exc()
                rows.append(Row(name, "FAILED", f"{type(exc).__name__}: {str(exc)[:120]}"))
            finally:
                common.stop_all()
            took[name] = time.monotonic() - started
            print(f"[{time.strftime('%H:%M:%S')}] {name} done in {took[name]:.0f}s", flush=True)
            for line in table([r for r in rows if r.bench == name]):
                print("   ", line, flush=True)
    return rows, raw, took


def _run_line(doc: str) -> str:
    """The "Run:" line of a page ``write_doc`` wrote."""
    return next((line for line in doc.splitlines() if line.startswith("Run: ")), "(no run line)")


def _kept(doc: str, only: list[str]) -> dict[str, tuple[list[str], object]]:
    """The result rows and raw figures of the benchmarks not in ``only`` on a page ``write_doc`` wrote."""
    results = doc.split("## Results", 1)[-1].split("## How each figure", 1)[0].splitlines()
    try:
        raw = json.loads(doc.split("## Raw figures", 1)[1].split("```json", 1)[1].split("```", 1)[0])
    except (IndexError, ValueError):
        raw = {}
    kept = {}
    for name in MODULES:
        rows = [line for line in results if line.startswith(f"| {name} |")]
        if name not in only and rows:
            kept[name] = (rows, raw.get(name))
    return kept


def write_doc(rows: list[Row], raw: dict, took: dict[str, float], quick: bool, machine: dict[str, str],
              only: list[str], merge: bool = False) -> None:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`bench/run.py`); do not edit by hand. Targets are goals printed next to the",
        "figures, not assertions. All flows run on one machine against one local broker, each in its own processes",
        "(workers and baselines are separate OS processes; "
        "the driver that publishes and reads the results is another).",
        "",
    ]
    if quick:
        lines += ["> **Quick run (`--quick`): small sizes, not the documented figures.** "
                  "Run `make bench` for those.", ""]
    old = DOC.read_text() if DOC.exists() else ""
    kept = _kept(old, only) if merge else {}
    lines += [f"Run: {when}, benchmarks {', '.join(only)}, {sum(took.values()):.0f} s in all "
              f"({', '.join(f'{k} {v:.0f} s' for k, v in took.items())})."]
    if kept:
        lines += [f"The figures of {', '.join(kept)} are kept from the page before: {_run_line(old)}"]
    lines += ["", "## Machine", ""]
    lines += [f"- {k}: {v}" for k, v in machine.items()]
    table = markdown(rows)
    body = [line for name in MODULES for line in (kept[name][0] if name in kept else
                                                  [r for r in table[2:] if r.startswith(f"| {name} |")])]
    lines += ["", "## Results", "", *table[:2], *body, "", "## How each figure is measured", ""]
    raw = {**{name: kept[name][1] for name in kept}, **raw}
    for name in [n for n in MODULES if n in only or n in kept]:
        doc = (MODULES[name].__doc__ or "").strip()
        lines += [f"### {name}", "", doc, ""]
    if NOTES.exists():  # findings written by hand (profiles, what limits a figure): kept across runs
        lines += [NOTES.read_text().strip(), ""]
    lines += [
        "### Sizes", "",
        f"`{'--quick' if quick else 'full'}`: " + ", ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v:g}"
                                                            for k, v in SIZES["quick" if quick else "full"].items()),
        "", "## Raw figures", "", "```json", json.dumps(raw, indent=1, default=str, sort_keys=True), "```", "",
    ]
    if PEERS_BEGIN in old and PEERS_END in old:  # the section `make bench-peers` writes: kept as it was
        lines += [PEERS_BEGIN + old.split(PEERS_BEGIN, 1)[1].split(PEERS_END, 1)[0] + PEERS_END, ""]
    DOC.write_text("\n".join(lines))


def cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="B1,B2,B3,B4,B5,B6,B7,B8", help="comma-separated subset, e.g. B1,B3")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run; figures not final)")
    parser.add_argument("--b3-rate", type=float, default=None,
                        help="B3's rate, measured without the sustained-rate search (default: half the sustained rate)")
    parser.add_argument("--no-write", action="store_true", help=f"print only; leave {DOC.relative_to(ROOT)} alone")
    parser.add_argument("--merge", action="store_true",
                        help="with --only: keep the other benchmarks' figures from the page (the page says so)")
    args = parser.parse_args()
    only = [x.strip().upper() for x in args.only.split(",") if x.strip()]
    unknown = [x for x in only if x not in MODULES]
    if unknown:
        parser.error(f"unknown benchmarks {unknown}; known: {', '.join(MODULES)}")
    atexit.register(common.stop_all)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: every finally stops its processes
    machine = common.machine()
    print("Machine:", *(f"  {k}: {v}" for k, v in machine.items()), sep="\n", flush=True)
    rows, raw, took = asyncio.run(main(only, args.quick, args.b3_rate))
    print(f"\nagents-stream benchmarks{' (QUICK: small sizes, not final)' if args.quick else ''}:"
          f" {sum(took.values()):.0f} s\n")
    print("\n".join(table(rows)))
    if not args.no_write:
        write_doc(rows, raw, took, args.quick, machine, only, merge=args.merge)
        print(f"\nwritten: {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli())
