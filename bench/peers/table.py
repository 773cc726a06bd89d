"""The peers' table: one row per system, then a row of ours / peer ratios under each peer; printed and written."""

from __future__ import annotations

from typing import Any

from bench.peers.load import Sizes

NA = "—"


def heads(sizes: Sizes) -> list[str]:
    return ["system", "concurrency", "(a) tasks/s per worker, model 200 ms", "(a) worker CPU",
            f"(b) overhead p50 / p99 at {sizes.rate:g} tasks/s, instant model",
            "(c) after a SIGKILL: calls per task (duplicates), tasks without a result", "(d) worker RSS (peak)",
            "own servers (Pss)"]


def _cells(r: dict[str, Any]) -> list[str]:
    if "error" in r:
        return [r["name"], r["error"], *[NA] * 6]
    a, b, c = r.get("a"), r.get("b"), r.get("c")
    cells = [r["name"], r["concurrency"]]
    if a:
        cells += [f"{a['rate']:,.1f}" + ("" if a["done"] == a["n"] else f" ({a['done']}/{a['n']} done)"),
                  f"{a['cpu_ms_per_task']:.2f} ms/task, {a['cpu_cores']:.2f} cores"]
    else:
        cells += [r.get("a_error", NA), NA]
    if b:
        cells.append(f"{b['p50_ms']:.1f} / {b['p99_ms']:.1f} ms"
                     + ("" if b["done"] == b["n"] else f" ({b['done']}/{b['n']} done)")
                     + (" (falls behind: this rate is above what it does)" if b["p99_ms"] > 5000 else ""))
    else:
        cells.append(r.get("b_error", NA))
    if c:
        cells.append(f"{c['calls_per_task']:.3f} ({c['duplicates']} of {c['n']} tasks at {c['rate']:g}/s), "
                     f"{c['without_result']} without; last result {c['last_result_after_kill_s']:.1f} s after the kill")
    else:
        cells.append(r.get("c_error", NA))
    cells.append(f"{a['rss_mb']:.0f} MB ({a['rss_peak_mb']:.0f} MB)" if a else NA)
    cells.append(f"{a['server_mb']:.0f} MB" if a and a.get("server_mb") is not None else "Kafka broker (shared)")
    return cells


def _x(ours: float, peer: float) -> str:
    if not peer:
        return NA
    r = ours / peer
    return f"{r:.2f}×" if r >= 0.1 else f"{r:.1g}×"


def _ratios(ours: dict[str, Any], peer: dict[str, Any]) -> list[str] | None:
    """ours / peer: above 1 is ours higher (better for tasks/s, worse for CPU, latency and memory)."""
    if "error" in peer or "error" in ours:
        return None
    oa, pa, ob, pb, oc, pc = (ours.get("a"), peer.get("a"), ours.get("b"), peer.get("b"), ours.get("c"),
                              peer.get("c"))
    return [
        f"  ours / {peer['name']}", "",
        _x(oa["rate"], pa["rate"]) if oa and pa else NA,
        _x(oa["cpu_ms_per_task"], pa["cpu_ms_per_task"]) if oa and pa else NA,
        f"{_x(ob['p50_ms'], pb['p50_ms'])} / {_x(ob['p99_ms'], pb['p99_ms'])}" if ob and pb else NA,
        f"calls per task {oc['calls_per_task']:.3f} vs {pc['calls_per_task']:.3f}, without a result "
        f"{oc['without_result']} vs {pc['without_result']}" if oc and pc else NA,
        _x(oa["rss_mb"], pa["rss_mb"]) if oa and pa else NA,
        "",
    ]


def rows(results: dict[str, dict[str, Any]]) -> list[list[str]]:
    out = []
    ours = results.get("ours")
    for key, r in results.items():
        out.append(_cells(r))
        if ours is not None and not key.startswith("ours") and (ratio := _ratios(ours, r)):
            out.append(ratio)
    return out


def markdown(results: dict[str, dict[str, Any]], sizes: Sizes) -> list[str]:
    head = heads(sizes)
    return [f"| {' | '.join(head)} |", "|" + "---|" * len(head),
            *(f"| {' | '.join(c.strip() for c in cells)} |" for cells in rows(results))]


def text(results: dict[str, dict[str, Any]], sizes: Sizes) -> list[str]:
    """The same table for a terminal: one block per system (the cells are too wide for columns)."""
    head = heads(sizes)
    out = []
    for cells in rows(results):
        out.append(cells[0])
        out += [f"    {h}: {c}" for h, c in zip(head[1:], cells[1:], strict=True) if c]
    return out
