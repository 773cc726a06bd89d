"""B8: the support desk. One worker runs the desk of `docs/examples/desk.toml` as written (a routed entry point: FAQ
→ one call of the small model, order status → a chain with no model call, refunds and disputes → the tool-using
support agent on the large model, a small classifier for what no rule matches) and, beside it in the same worker,
the baseline: the same support agent as the only handler of every message. A scripted mix of 20 customer messages
(8 FAQ, 6 order status, 3 refunds of 42.50, 3 that no rule matches: 2 questions the classifier sends to the FAQ and
a complaint it sends to the agent), each the first message of a conversation of its own, sent over HTTP one at a
time, alternately to the desk and to the baseline (so the machine's noise falls on both alike), the mix repeated.

The models are the fake LLM, answering as the handlers would: the agent looks an order up before a status answer
(2 calls) and looks up, labels and refunds, notifies and answers for a refund (4 calls); an FAQ or a complaint it
answers at once (1 call). The fake takes 1,000 ms a call of the large model and 300 ms of the small one, and
reports tokens as a tokenizer would count the request it received (its messages and its tools' schemas, 4
characters a token) and its answer. Cost is what the worker itself reports in each round's result (`usage.cost`,
from the config's `[prices]`: large 2.50 / 10.00 USD, small 0.15 / 0.60 USD per million tokens in / out); latency
is a message sent → its reply read over HTTP. Noise: the spread of each side's mean latency over the repeats.
Run alone: `make bench BENCH_ARGS="--only B8 --merge"` (about 4 minutes; these figures:
`KAFKA_BOOTSTRAP=127.0.0.1:9092 .venv/bin/python bench/run.py --only B8 --merge`, the same without the install
step); `.venv/bin/python -m bench.b8_desk 3` prints them without writing this page. Each kind's cost and latency,
both sides: "Raw figures", B8 `by_kind`.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from agents_stream.client import Client
from agents_stream.contract.conversation_messages import round_task_id
from agents_stream.examples.services import FakeServices
from agents_stream.execution.routing_definitions import CLASSIFIER_SYSTEM
from agents_stream.testing.fakellm import FakeLLM, Reply, call, ok, tool_calls
from bench import common
from bench.report import Row
from tests.integration import harness
from tests.integration.test_desk import desk_config

TOKEN = "bench-desk-token"
LARGE_S, SMALL_S = 1.0, 0.3  # the fake's time per call of each model
CHARS_PER_TOKEN = 4
#: the scripted mix: (message, what it is); {order} is a fresh order id per message
MIX: list[tuple[str, str]] = [
    ("What are your opening hours?", "faq"),
    ("Where is my order {order}?", "status"),
    ("How much is shipping to Berlin?", "faq"),
    ("I was charged twice for {order}, please refund me.", "refund"),
    ("What is your return policy for shoes?", "faq"),
    ("Has my order {order} shipped yet?", "status"),
    ("Are you open on Sunday?", "faq"),
    ("Do you ship to Norway?", "faq_classified"),
    ("Where is the package {order}? It is late.", "status"),
    ("What is the delivery time for express shipping?", "faq"),
    ("The parcel {order} arrived broken, I want my money back.", "refund"),
    ("Status of my order {order} please", "status"),
    ("Your courier was rude to me.", "complaint"),
    ("How do returns work if I lost the receipt?", "faq"),
    ("Where is my order {order}? The tracking page is empty.", "status"),
    ("Can I pay by invoice?", "faq_classified"),
    ("I dispute the charge on {order}, refund it.", "refund"),
    ("What are your opening hours on holidays?", "faq"),
    ("Where is my parcel {order}?", "status"),
    ("Is shipping free above 50?", "faq"),
]
FAQ_ANSWER = "We are open 9:00 to 17:00, Monday to Saturday; shipping is free above 50 and takes 2 to 4 days."
ORDER = re.compile(r"\bo-[A-Za-z0-9_-]+\b")


def _tokens(value: Any) -> int:
    return max(1, math.ceil(len(json.dumps(value, ensure_ascii=False)) / CHARS_PER_TOKEN))


class Models:
    """The fake's responder: each request answered as the handler that sent it would be, by the message's kind."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names
        self.kinds: dict[str, str] = {}  # message text → kind

    def __call__(self, record: Any, turn: int) -> Reply:
        body = record.body or {}
        said = "\n".join(str(m.get("content") or "") for m in body.get("messages") or [])
        kind = next((k for text, k in self.kinds.items() if text in said), "faq")
        tokens_in = _tokens([body.get("messages"), body.get("tools")])
        if CLASSIFIER_SYSTEM in said:
            handler = self.names["support" if kind == "complaint" else "faq"]
            return ok(handler, input_tokens=tokens_in, output_tokens=2, latency=SMALL_S)
        if not body.get("tools"):  # the FAQ handler: one call of the small model
            return ok(FAQ_ANSWER, input_tokens=tokens_in, output_tokens=_tokens(FAQ_ANSWER), latency=SMALL_S)
        order = (ORDER.findall(said) or ["o-unknown"])[-1]
        steps: list[Reply]
        if kind == "status":
            steps = [tool_calls(call("lookup_order", {"order_id": order})),
                     ok(f"Your order {order} is delivered (amount 42.50).")]
        elif kind == "refund":
            steps = [tool_calls(call("lookup_order", {"order_id": order})),
                     tool_calls(call("create_label", {"order_id": order}),
                                call("refund", {"order_id": order, "amount": 42.5})),
                     tool_calls(call("notify_customer", {"email": "customer@example.com", "text": "Refunded 42.50"})),
                     ok("Refunded 42.50 and sent a return label.")]
        elif kind == "complaint":
            steps = [ok("I am sorry; I have passed this on to our courier team.")]
        else:
            steps = [ok(FAQ_ANSWER)]
        reply = steps[min(turn, len(steps) - 1)]
        said_out = reply.text or json.dumps(reply.calls)
        return replace(reply, input_tokens=tokens_in, output_tokens=_tokens(said_out), latency=LARGE_S)


async def _one(client: Client, worker: Any, agent: str, text: str) -> dict[str, Any]:
    cid = harness.unique("b8")
    started = time.monotonic()
    sent = await client.send(cid, agent, text)
    reply = await client.reply(cid, sent.message_id, timeout=120, every=0.02)
    took = time.monotonic() - started
    if reply.get("status") != "succeeded":
        raise RuntimeError(f"{agent} did not answer {text!r}: {reply}")
    round_id = round_task_id(cid, 1, common.PARTITIONS, sent.offset)
    async with aiohttp.ClientSession() as s, s.get(
        f"http://127.0.0.1:{worker.web_port}/tasks/{quote(round_id, safe='')}",
        headers={"Authorization": f"Bearer {TOKEN}"},
    ) as r:
        usage = ((await r.json()).get("result") or {}).get("usage") or {}
    return {"latency_s": took, "cost": usage.get("cost") or 0.0, "round": round_id, "text": reply["text"]}


async def run(tmp: Path, repeats: int) -> tuple[list[Row], dict[str, Any]]:
    async with FakeServices() as services, FakeLLM(default=None) as fake:
        toml, names = desk_config(fake.url)
        full = harness.unique("full")
        toml += (f'\n[agents.{full}]\nproviders = ["large"]\nagent = "agents_stream.examples.support:SUPPORT"\n'
                 f'[[agents.{full}.approval.levels]]\nname = "team-lead"\ntimeout_s = 600\n')  # as the desk's
        models = Models(names)
        fake.responder = models
        cluster = harness.Cluster(common.subdir(tmp, "cluster"), [*names.values(), full], None, toml=toml,
                                  settings={**common.PRODUCT_DEFAULTS, "AGENTS_STREAM_API_TOKEN": TOKEN,
                                            "AGENTS_STREAM_REFUND_SERVICES": services.url})
        worker = common.track(cluster.worker().start())
        sides: dict[str, dict[str, list[Any]]] = {
            side: {"latency_s": [], "cost": [], "calls": [], "kinds": []} for side in ("desk", "full")}
        means: dict[str, list[float]] = {"desk": [], "full": []}
        try:
            await worker.wait_ready(timeout=120)
            async with Client(f"http://127.0.0.1:{worker.web_port}", TOKEN) as client:
                models.kinds["What are your opening hours today?"] = "faq"
                for agent in (names["desk"], full):  # warm-up, not counted
                    await _one(client, worker, agent, "What are your opening hours today?")
                for _ in range(repeats):
                    this = {"desk": [], "full": []}
                    for template, kind in MIX:
                        for side, agent in (("desk", names["desk"]), ("full", full)):
                            text = template.format(order=f"o-{harness.unique('x')[2:]}")
                            models.kinds[text] = kind
                            got = await _one(client, worker, agent, text)
                            calls = [r for r in fake.requests if r.task_id and r.task_id.startswith(got["round"])]
                            for k, v in (("latency_s", got["latency_s"]), ("cost", got["cost"]),
                                         ("calls", len(calls)), ("kinds", kind)):
                                sides[side][k].append(v)
                            this[side].append(got["latency_s"])
                    for side in means:
                        means[side].append(statistics.mean(this[side]))
        except Exception:
            print(worker.tail(), flush=True)
            raise
        finally:
            worker.close()
    out: dict[str, Any] = {"messages": len(MIX) * repeats, "repeats": repeats, "large_s": LARGE_S,
                           "small_s": SMALL_S, "refunds": len(services.executed("payment.refund"))}
    for side, got in sides.items():
        lat = got["latency_s"]
        out[side] = {
            "cost_per_message_usd": statistics.mean(got["cost"]), "calls_per_message": statistics.mean(got["calls"]),
            "latency_mean_ms": statistics.mean(lat) * 1000, "latency_p50_ms": statistics.median(lat) * 1000,
            "latency_p90_ms": common.percentile(lat, 90) * 1000,
            "noise_ms": (max(means[side]) - min(means[side])) * 1000,
            "by_kind": {k: {"cost_usd": statistics.mean(c for c, kk in zip(got["cost"], got["kinds"], strict=True)
                                                        if kk == k),
                            "latency_ms": statistics.mean(t for t, kk in zip(lat, got["kinds"], strict=True)
                                                          if kk == k) * 1000}
                        for k in sorted(set(got["kinds"]))},
        }
    d, f = out["desk"], out["full"]
    out["cost_ratio"] = d["cost_per_message_usd"] / f["cost_per_message_usd"]
    out["latency_ratio"] = d["latency_mean_ms"] / f["latency_mean_ms"]
    n = out["messages"]
    rows = [
        Row("B8", f"routed desk, {n} messages (20-message mix x{repeats}): cost / calls / latency a message",
            f"{d['cost_per_message_usd'] * 1e6:.0f} µUSD / {d['calls_per_message']:.2f} calls / mean "
            f"{d['latency_mean_ms']:.0f} ms, p50 {d['latency_p50_ms']:.0f}, p90 {d['latency_p90_ms']:.0f} ms"),
        Row("B8", "every message to the full support agent (same run, same mix)",
            f"{f['cost_per_message_usd'] * 1e6:.0f} µUSD / {f['calls_per_message']:.2f} calls / mean "
            f"{f['latency_mean_ms']:.0f} ms, p50 {f['latency_p50_ms']:.0f}, p90 {f['latency_p90_ms']:.0f} ms"),
        Row("B8", "  ratio desk / full agent: cost, latency",
            f"cost x{out['cost_ratio']:.2f} ({(1 - out['cost_ratio']) * 100:.0f}% saved), "
            f"latency x{out['latency_ratio']:.2f}", "cost ≤ x0.5", out["cost_ratio"] <= 0.5),
        Row("B8", "  noise: spread of the mean latency over the repeats, desk / full",
            f"{d['noise_ms']:.0f} / {f['noise_ms']:.0f} ms"),
    ]
    return rows, out


if __name__ == "__main__":  # a run of its own: python -m bench.b8_desk [REPEATS]
    import sys
    import tempfile

    from bench.report import table

    async def main() -> None:
        with tempfile.TemporaryDirectory(prefix="agents-stream-bench-") as d:
            rows, raw = await run(Path(d), int(sys.argv[1]) if len(sys.argv) > 1 else 3)
            print("\n".join(table(rows)))
            print(json.dumps(raw, indent=1, default=str))

    asyncio.run(main())
