"""One trace's spans (as an OTLP receiver got them) drawn as a static HTML/SVG waterfall: a tree of rows, a bar per
span on one time axis, its events as marks, a colour per process that made it. No script, no network."""

from __future__ import annotations

import html
from typing import Any

from agents_stream.testing.otlp import ReceivedSpan

ROW, LEFT, WIDTH, TOP = 30, 470, 1280, 96
#: fill colours of the processes, in the order they first appear
PALETTE = ["#6c7a89", "#2f6fdf", "#1f9d55", "#b7791f", "#9f3fbf"]


def tree_order(spans: list[ReceivedSpan]) -> list[tuple[int, ReceivedSpan]]:
    """(depth, span) depth first from the roots, children by start time."""
    ids = {s.span_id for s in spans}
    children: dict[str | None, list[ReceivedSpan]] = {}
    for s in spans:
        children.setdefault(s.parent_id if s.parent_id in ids else None, []).append(s)
    out: list[tuple[int, ReceivedSpan]] = []

    def walk(parent: str | None, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda x: x.start_ns):
            out.append((depth, s))
            walk(s.span_id, depth + 1)

    walk(None, 0)
    return out


def _who(span: ReceivedSpan, names: dict[str, str]) -> str:
    """A worker's spans (service agents-stream) by its instance, numbered as they appear; a command's by its
    service name."""
    if span.service != "agents-stream":
        return span.service
    if span.instance not in names:
        pid = span.instance.split(":")[1] if span.instance.count(":") >= 2 else span.instance
        names[span.instance] = f"worker {len(names) + 1} (pid {pid})"
    return names[span.instance]


def _detail(span: ReceivedSpan) -> str:
    a: dict[str, Any] = span.attributes
    if span.name.startswith("chat "):
        cost = a.get("agents_stream.cost_usd")
        tokens = f"{a.get('gen_ai.usage.input_tokens', '?')}→{a.get('gen_ai.usage.output_tokens', '?')} tokens"
        return tokens + (f" · ${cost:.5f}" if isinstance(cost, float) else "") if "gen_ai.usage.input_tokens" in a \
            else "no answer"
    if span.name.startswith("execute_tool "):
        return f"call {a.get('gen_ai.tool.call.id', '')}"
    if span.name.startswith("dispatch "):
        return f"attempt {a.get('agents_stream.dispatch', '?')}"
    if span.name.startswith("intake "):
        return f"p{a.get('messaging.destination.partition.id', '?')}@{a.get('messaging.kafka.offset', '?')} · " \
               f"{a.get('agents_stream.state', '')}"
    if span.name.startswith("result "):
        return f"{a.get('agents_stream.result.status', '')} · {a.get('agents_stream.result.source', '')}"
    return ""


def render(spans: list[ReceivedSpan], title: str, marks: list[tuple[int, str]] | None = None) -> str:
    """The page; ``marks``: (time in ns, what happened) drawn as dashed red lines across the plot."""
    rows = tree_order(spans)
    start = min(s.start_ns for s in spans)
    end = max(s.end_ns for s in spans)
    total = max(end - start, 1)
    plot = WIDTH - LEFT - 30
    height = TOP + ROW * len(rows) + 40
    names: dict[str, str] = {}
    colours: dict[str, str] = {}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
             f'font-family="Liberation Sans, Arial, sans-serif">',
             f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>',
             f'<text x="16" y="30" font-size="19" font-weight="bold" fill="#1a202c">{html.escape(title)}</text>']
    seconds = total / 1e9
    step = next(x for x in (0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 20, 60, 120) if seconds / x <= 10)
    t = 0.0
    while t <= seconds + 1e-9:
        x = LEFT + plot * (t / seconds)
        parts.append(f'<line x1="{x:.1f}" y1="{TOP - 14}" x2="{x:.1f}" y2="{height - 30}" stroke="#e2e8f0"/>')
        parts.append(f'<text x="{x:.1f}" y="{TOP - 20}" font-size="11" fill="#718096" text-anchor="middle">'
                     f'{t:g}s</text>')
        t += step
    for at, what in marks or []:
        mx = LEFT + plot * (at - start) / total
        parts.append(f'<line x1="{mx:.1f}" y1="{TOP - 8}" x2="{mx:.1f}" y2="{height - 30}" stroke="#e53e3e" '
                     f'stroke-dasharray="5 4" stroke-width="1.5"/>')
        parts.append(f'<text x="{mx + 6:.1f}" y="{TOP - 2}" font-size="11" font-weight="bold" fill="#c53030">'
                     f'{html.escape(what)}</text>')
    for i, (depth, s) in enumerate(rows):
        y = TOP + i * ROW
        who = _who(s, names)
        colour = colours.setdefault(who, PALETTE[len(colours) % len(PALETTE)])
        if i % 2:
            parts.append(f'<rect x="0" y="{y - 4}" width="{WIDTH}" height="{ROW}" fill="#f7fafc"/>')
        label = html.escape(s.name)
        detail = html.escape(_detail(s))
        parts.append(f'<text x="{16 + depth * 18}" y="{y + 15}" font-size="13" fill="#1a202c">{label}'
                     f'<tspan fill="#718096" font-size="11">  {detail}</tspan></text>')
        x0 = LEFT + plot * (s.start_ns - start) / total
        w = max(plot * (s.end_ns - s.start_ns) / total, 3.0)
        stroke = ' stroke="#e53e3e" stroke-width="2"' if s.status == 2 else ""
        parts.append(f'<rect x="{x0:.1f}" y="{y + 2}" width="{w:.1f}" height="16" rx="3" fill="{colour}"{stroke}>'
                     f'<title>{label} ({(s.end_ns - s.start_ns) / 1e6:.1f} ms) {html.escape(who)}</title></rect>')
        ms = (s.end_ns - s.start_ns) / 1e6
        right = x0 + w + 6 < WIDTH - 60
        parts.append(f'<text x="{(x0 + w + 6) if right else (x0 - 6):.1f}" y="{y + 15}" font-size="10" '
                     f'fill="#4a5568" text-anchor="{"start" if right else "end"}">{ms:.0f} ms</text>')
        for name, at, _ in s.events:
            ex = LEFT + plot * (at - start) / total
            parts.append(f'<path d="M{ex:.1f} {y - 1} l5 5 l-5 5 l-5 -5 z" fill="#d69e2e" stroke="#744210"/>')
            anchor, tx = ("end", ex - 8) if ex > WIDTH - 180 else ("start", ex + 8)
            parts.append(f'<text x="{tx:.1f}" y="{y + 2}" font-size="10" fill="#744210" text-anchor="{anchor}">'
                         f'{html.escape(name)}</text>')
    legend_y = height - 14
    x = 16.0
    for who, colour in colours.items():
        parts.append(f'<rect x="{x}" y="{legend_y - 10}" width="12" height="12" rx="2" fill="{colour}"/>')
        parts.append(f'<text x="{x + 18}" y="{legend_y}" font-size="12" fill="#2d3748">{html.escape(who)}</text>')
        x += 30 + 7.2 * len(who)
    parts.append(f'<text x="{x + 10}" y="{legend_y}" font-size="12" fill="#744210">◆ span event</text>')
    parts.append("</svg>")
    svg = "\n".join(parts)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>body{{margin:0;background:#fff}}</style></head><body>{svg}</body></html>")


def page_height(spans: list[ReceivedSpan]) -> int:
    return TOP + ROW * len(spans) + 40
