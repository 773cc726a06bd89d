"""The result table: one row per figure, with its target; printed and written to docs/benchmarks.md."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Row:
    bench: str
    metric: str
    value: str
    target: str = ""
    met: bool | None = None  # None: no target, or not measured

    @property
    def verdict(self) -> str:
        return "" if self.met is None else ("met" if self.met else "MISSED")


def table(rows: list[Row]) -> list[str]:
    head = ["bench", "figure", "value", "target", ""]
    body = [[r.bench, r.metric, r.value, r.target, r.verdict] for r in rows]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
    return [line(head), line(["-" * w for w in widths]), *(line(b) for b in body)]


def markdown(rows: list[Row]) -> list[str]:
    out = ["| bench | figure | value | target | |", "|---|---|---|---|---|"]
    out += [f"| {r.bench} | {r.metric} | {r.value} | {r.target} | {r.verdict} |" for r in rows]
    return out


def rate(x: float) -> str:
    return f"{x:,.0f} tasks/s"


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")
