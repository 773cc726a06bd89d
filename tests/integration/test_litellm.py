"""A real LiteLLM proxy (litellm[proxy], its own process and venv, mock answers: no network) as the
OpenAI-compatible provider of two real workers: completions, an agent's tool calls, its 429s' waits in the shared
circuits, its usage priced by our [prices]. One test: the proxy's start (~13 s of CPU) is paid once."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from agents_stream.config import Price
from agents_stream.contract import topics
from agents_stream.execution import pricing

from .harness import Worker, encode, eventually, produce, results_for, task, unique
from .litellm_proxy import LiteLLMProxy

PRICES = {"text-model": Price(input_per_mtok=2.5, output_per_mtok=10.0),
          "agent-model": Price(input_per_mtok=1.0, output_per_mtok=4.0)}
#: the Retry-After LiteLLM sends while cool-model cools down, and the llm_provider-retry-after of its rpm limit
COOLDOWN_S, RPM_WAIT_S = 30.0, 60.0
#: LiteLLM's mock usage when a mock_response is a plain string (DEFAULT_MOCK_RESPONSE_*_TOKEN_COUNT)
MOCK_USAGE = (10, 20)

TRACKER_MODULE = '''
import json
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.tools import ToolContext, tool

LOOKUPS = {lookups!r}
HISTORY = "\\n".join(f"2026-11-{{d:02d}} 08:{{d:02d}} scanned at depot {{d}} on its way" for d in range(1, 31))


@tool
async def lookup_order(ctx: ToolContext, order_id: str) -> str:
    """Look an order up: its status and its whole tracking history."""
    with open(LOOKUPS, "a") as f:
        f.write(json.dumps({{"order_id": order_id, "key": ctx.key}}) + "\\n")
    return f"order {{order_id}}: delivered on 2026-11-30\\n{{HISTORY}}"


TRACKER = Agent("tracker", "You answer questions about orders. Look the order up before you answer.",
                tools=[lookup_order], max_turns=4)
'''


def config_toml(proxy: LiteLLMProxy, agents: dict[str, str], module: str) -> str:
    """Our side of the gateway: one provider per LiteLLM model name, the key from the environment."""
    out = []
    for name, model in (("lite_text", "text-model"), ("lite_agent", "agent-model"), ("lite_cool", "cool-model"),
                        ("lite_busy", "busy-model")):
        out += [f"[providers.{name}]", 'kind = "openai"', f'base_url = "{proxy.url}/v1"', f'model = "{model}"',
                'api_key_env = "LITELLM_API_KEY"', "timeout_s = 10", ""]
    out.append("[prices]")
    out += [f'"{m}" = {{ input_per_mtok = {p.input_per_mtok}, output_per_mtok = {p.output_per_mtok} }}'
            for m, p in PRICES.items()]
    out += ["", f'[agents.{agents["priced"]}]', 'providers = ["lite_text"]',
            f'[agents.{agents["tracker"]}]', 'providers = ["lite_agent"]', f'agent = "{module}:TRACKER"',
            f'[agents.{agents["limited"]}]', 'providers = ["lite_cool", "lite_text"]',
            f'[agents.{agents["busy"]}]', 'providers = ["lite_busy", "lite_text"]', ""]
    return "\n".join(out)


async def together(*steps: Awaitable[Any]) -> list[Any]:
    """Run the steps at once; if one fails the others are cancelled and awaited, not left running."""
    tasks = [asyncio.ensure_future(s) for s in steps]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def results(ts: list[dict[str, Any]], timeout: float = 60) -> dict[str, dict[str, Any]]:
    """One result per task, asserting that redeliveries (if any) were byte-identical."""
    got = await results_for({t["task_id"] for t in ts}, timeout=timeout)
    assert set(got) == {t["task_id"] for t in ts}, "every task has a result"
    assert all(len({m.value for m in msgs}) == 1 for msgs in got.values()), "one distinct result per task"
    return {task_id: json.loads(msgs[0].value) for task_id, msgs in got.items()}


def calls(scraped: list[str], provider: str) -> dict[str, float]:
    """agents_stream_provider_calls_total of one provider by outcome, summed over the workers' /metrics."""
    out: dict[str, float] = {}
    for text in scraped:
        for line in text.splitlines():
            if line.startswith("agents_stream_provider_calls_total{") and f'provider="{provider}"' in line:
                outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
                out[outcome] = out.get(outcome, 0.0) + float(line.rsplit(" ", 1)[1])
    return {k: v for k, v in out.items() if v}


async def test_agents_behind_a_real_litellm_proxy(cluster_factory, tmp_path: Path):
    """Through a real LiteLLM proxy: a completion and its usage priced by our [prices]; a Python agent's tool call
    round-trips (LiteLLM's mocked tool_calls, our tool run with its arguments, the result sent back, the final
    answer); LiteLLM's 429s (a plain Retry-After while a model cools down, llm_provider-retry-after from its rpm
    limit) block the provider on both workers for as long as LiteLLM said, and the tasks take the alternate."""
    agents = {k: unique(k) for k in ("priced", "tracker", "limited", "busy")}
    module, lookups = unique("tracker_def"), tmp_path / "lookups.jsonl"
    (tmp_path / f"{module}.py").write_text(TRACKER_MODULE.format(lookups=str(lookups)))
    proxy = LiteLLMProxy(tmp_path).start()
    try:
        c = cluster_factory(list(agents.values()), None, toml=config_toml(proxy, agents, module),
                            LITELLM_API_KEY=proxy.key, PYTHONPATH=str(tmp_path))
        started = time.monotonic()
        a, b, ready_s = await together(c.started("a"), c.started("b"), proxy.wait_ready())
        print(f"\nlitellm: proxy ready in {ready_s:.1f} s, both workers in {time.monotonic() - started:.1f} s")
        await check_the_proxys_429s(proxy)

        priced, tracker = task(agents["priced"], instruction="Summarise the quarter."), task(
            agents["tracker"], instruction="Where is my order?", context_data={"order_id": "o-42"})
        limited, busy = task(agents["limited"], instruction="Summarise."), task(agents["busy"], instruction="Sum.")
        published = time.time()
        await asyncio.gather(*(produce(topics.task_topic(t["agent_name"]), [encode(t)])
                               for t in (priced, tracker, limited, busy)))
        first = await results([priced, tracker, limited, busy])
        print(f"litellm: the first four results {time.time() - published:.1f} s after they were published")

        text_cost = pricing.cost(PRICES["text-model"], 1234, 567)
        assert text_cost == 0.008755
        done = first[priced["task_id"]]
        assert done["status"] == "succeeded" and done["output"] == "Quarterly revenue grew 12%."
        assert done["source"] == "primary:lite_text:text-model" and done["confidence"] == "high"
        assert done["usage"] == {"input_tokens": 1234, "output_tokens": 567, "cost": text_cost}, (
            "LiteLLM's usage, priced by our [prices]")

        check_the_tool_round_trip(first[tracker["task_id"]], tracker, lookups)

        for t in (limited, busy):
            r = first[t["task_id"]]
            assert r["status"] == "succeeded" and r["source"] == "alternate:lite_text:text-model", r
            assert r["confidence"] == "medium" and r["usage"]["cost"] == text_cost
        # Both workers hold each provider shut until LiteLLM's time: one saw the 429, the other folded it.
        for provider, wait in (("lite_cool", COOLDOWN_S), ("lite_busy", RPM_WAIT_S)):
            views = await eventually(lambda p=provider: blocked_on_both(a, b, p), timeout=10, interval=0.2,
                                     what=f"both workers holding {provider} shut")
            assert all(published + wait - 0.5 <= v["retry_after_until"] <= time.time() + wait + 0.5 for v in views), (
                f"{provider} is shut for the {wait:g} s LiteLLM said, not the 1 s default", views)
            learned = [v["retry_after_propagation_s"] for v in views if v["retry_after_propagation_s"] is not None]
            assert len(learned) == 1, f"exactly one worker learned {provider}'s wait from the other: {views}"
            print(f"litellm: {provider} shut for {wait:g} s on both workers (propagation {learned[0] * 1000:.1f} ms)")

        later = {k: [task(agents[k], instruction=f"Summarise {i}.") for i in range(6)] for k in ("limited", "busy")}
        await asyncio.gather(*(produce(topics.task_topic(agents[k]), [encode(t) for t in ts])
                               for k, ts in later.items()))
        rest = await results(later["limited"] + later["busy"])
        assert all(r["source"] == "alternate:lite_text:text-model" for r in rest.values())
        scraped = [await w.get("/metrics") for w in (a, b)]
        assert calls(scraped, "lite_cool") == {"rate_limited": 1.0}, "no call while LiteLLM's Retry-After runs"
        assert calls(scraped, "lite_busy") == {"rate_limited": 1.0}, "no call while llm_provider-retry-after runs"
        assert calls(scraped, "lite_text") == {"success": 3.0 + len(rest)}
        assert calls(scraped, "lite_agent") == {"success": 2.0}
        for w in (a, b):
            assert proxy.key not in w.log_path.read_text(errors="replace"), "the key never reaches a log"
    finally:
        proxy.stop()


async def check_the_proxys_429s(proxy: LiteLLMProxy) -> None:
    """What the proxy really sends (curl's view), before the workers rely on it."""
    status, headers, body = await proxy.chat("cool-model")
    assert status == 429 and "Retry-After" not in headers, (status, dict(headers), body)  # the mock names no wait
    status, headers, body = await proxy.chat("cool-model")  # cooling down now: LiteLLM's own 429 with a wait
    assert status == 429 and headers.get("Retry-After") == f"{COOLDOWN_S:g}", (status, dict(headers), body)
    status, headers, body = await proxy.chat("busy-model")
    assert status == 429 and "Retry-After" not in headers, (status, dict(headers), body)
    assert headers.get("llm_provider-retry-after") == f"{RPM_WAIT_S:g}", (status, dict(headers), body)


def check_the_tool_round_trip(r: dict[str, Any], t: dict[str, Any], lookups: Path) -> None:
    """Turn 0: LiteLLM's mocked tool call; the tool ran once with its arguments; turn 1, carrying the tool's long
    result, no longer fits the first deployment's context window and LiteLLM answers from the second."""
    assert r["status"] == "succeeded" and r["output"] == "Order o-42 was delivered on 30 November.", r
    assert r["source"] == "primary:lite_agent:agent-model" and r["confidence"] == "high"
    turns = r["transcript"]["turns"]
    assert [x["tool_calls"] for x in turns] == [["lookup_order"], []]
    assert r["transcript"]["tool_calls"] == [
        {"turn": 0, "id": "call_lookup_1", "name": "lookup_order", "error": False, "attempts": 1}]
    ran = [json.loads(line) for line in lookups.read_text().splitlines()]
    assert ran == [{"order_id": "o-42", "key": f"{t['task_id']}:0:call_lookup_1"}], "once, with the model's arguments"
    per_turn = pricing.cost(PRICES["agent-model"], *MOCK_USAGE)
    assert [x["usage"] for x in turns] == [
        {"input_tokens": MOCK_USAGE[0], "output_tokens": MOCK_USAGE[1], "cost": per_turn}] * 2
    assert r["usage"] == {"input_tokens": 2 * MOCK_USAGE[0], "output_tokens": 2 * MOCK_USAGE[1],
                          "cost": pricing.add(per_turn, per_turn)}


async def blocked_on_both(a: Worker, b: Worker, provider: str) -> list[dict[str, Any]] | None:
    views = [(await w.get("/circuits"))["providers"][provider] for w in (a, b)]
    return views if all(v["retry_after_until"] is not None for v in views) else None
