"""OpenTelemetry traces over OTLP/HTTP: `agents-stream publish` and real workers export to a receiver in the test
(an aiohttp server decoding the protobuf requests), and one task's spans form one tree across a worker killed
mid-call and the worker that finishes it. The tree is drawn to docs/screenshots/trace-tree.png."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agents_stream.contract import topics
from agents_stream.testing.fakellm import FakeLLM, call, hang, ok, tool_calls
from agents_stream.testing.otlp import OTLPReceiver, ReceivedSpan

from .harness import BOOTSTRAP, ROOT, eventually, results_for, task, unique
from .trace_waterfall import page_height, render

CHROMIUM = "/usr/bin/chromium"
SCREENSHOT = ROOT / "docs" / "screenshots" / "trace-tree.png"
# the agent the workers load (PYTHONPATH): one tool, so a run has a model call, a tool call and a model call
AGENT_MODULE = '''
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.tools import ToolContext, tool


@tool
async def lookup_order(ctx: ToolContext, order_id: str) -> str:
    """Where an order is."""
    return f"order {order_id}: shipped yesterday, tracking 1Z999"


ORDERS = Agent("orders", "Answer questions about orders; look them up first.", tools=[lookup_order])
'''


def config(fake: FakeLLM, agent: str) -> str:
    return (f'[providers.p]\nkind = "openai"\nbase_url = "{fake.url}/v1"\nmodel = "fake-model"\ntimeout_s = 20\n\n'
            f'[prices.fake-model]\ninput_per_mtok = 3.0\noutput_per_mtok = 15.0\n\n'
            f'[agents.{agent}]\nproviders = ["p"]\nagent = "traced_agent:ORDERS"\n')


def turns_asked(fake: FakeLLM, task_id: str) -> list[int]:
    """The turn each model request of the task asks for (the assistant turns it carries)."""
    return [sum(1 for m in (r.body or {}).get("messages", []) if m.get("role") == "assistant")
            for r in fake.requests if r.task_id == task_id]


def publish(agent: str, line: dict[str, Any], otel: dict[str, str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "KAFKA_BROKER": f"kafka://{BOOTSTRAP}", **otel}
    return subprocess.run(
        [sys.executable, "-m", "agents_stream.ops.cli", "publish", "--agent", agent, "-"],
        input=json.dumps(line) + "\n", capture_output=True, text=True, timeout=60, env=env, cwd=ROOT,
    )


def named(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name]


def screenshot(spans: list[ReceivedSpan], title: str, tmp: Path, marks: list[tuple[int, str]]) -> None:
    """The waterfall in headless Chromium, to docs/screenshots/trace-tree.png (fails, never skips, without it)."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} missing: run `bash scripts/chromium.sh` (make test does it first)", pytrace=False)
    page = tmp / "trace-tree.html"
    page.write_text(render(spans, title, marks), encoding="utf-8")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    shot = tmp / "trace-tree.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
             f"--user-data-dir={tmp / 'chromium-profile'}", f"--window-size=1280,{page_height(spans)}",
             f"--screenshot={shot}", page.as_uri()]
    done = subprocess.run([CHROMIUM, *flags], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and shot.exists() and shot.stat().st_size > 10_000, done.stderr[-2000:]
    SCREENSHOT.write_bytes(shot.read_bytes())


async def test_one_task_is_one_trace_from_publish_to_result_across_a_worker_killed_mid_call(
    cluster_factory, fake_llm, tmp_path,
):
    """Published with a traceparent by `agents-stream publish`; worker 1 takes the task in, runs turn 0 (a model
    call and a tool call) and is SIGKILLed while turn 1's model call is in flight; worker 2 takes it over when the
    lease lapses and finishes it. Every span exported (from the command and both workers) has the publish span's
    trace id and a parent among them: one root, the publish span; both attempts' dispatch spans and the result
    hang under worker 1's intake span, whose traceparent the task's record kept across the restart; each model
    call is a GenAI span with tokens and cost; the re-dispatch names the worker it took over from."""
    (tmp_path / "traced_agent.py").write_text(AGENT_MODULE)
    async with OTLPReceiver() as otlp:
        agent = unique("traced")
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "200"}
        c = cluster_factory([agent], None, toml=config(fake_llm, agent), PYTHONPATH=str(tmp_path), **otel)
        first = await c.started("a")
        t = task(agent, instruction="Where is order o-1?")
        fake_llm.enqueue(tool_calls(call("lookup_order", {"order_id": "o-1"}, id="c1")), hang(60))
        sent = await asyncio.to_thread(publish, agent, t, otel)
        assert sent.returncode == 0 and sent.stdout.split() == [t["task_id"]], sent.stderr
        await eventually(lambda: turns_asked(fake_llm, t["task_id"]) == [0, 1], timeout=30, what="turn 1 in flight")
        # worker 1's finished spans are exported (the in-flight call's is not, and never will be)
        ran = {"chat fake-model", "execute_tool lookup_order", f"dispatch {agent}", f"intake {agent}"}
        await eventually(lambda: ran <= {s.name for s in otlp.spans}, timeout=10, what="worker 1's spans exported")
        killed_ns = time.time_ns()
        first.kill()
        fake_llm.enqueue(ok("Order o-1 shipped yesterday (tracking 1Z999)."))
        await c.started("a")  # restarted: it takes the task over once the lease lapses
        results = await results_for({t["task_id"]}, timeout=60)
        result = json.loads(results[t["task_id"]][0].value)
        assert result["status"] == "succeeded" and turns_asked(fake_llm, t["task_id"]) == [0, 1, 1]
        await eventually(lambda: named(otlp.spans, f"result {agent}"), timeout=15, what="the result span")

    (root,) = named(otlp.spans, f"publish {topics.task_topic(agent)}")
    spans = otlp.trace(root.trace_id)
    ids = {s.span_id for s in spans}
    print(f"\ntracing: {len(spans)} spans in trace {root.trace_id}: {sorted(s.name for s in spans)}")
    assert [s.name for s in spans if s.parent_id is None] == [root.name] and root.service == "agents-stream-publish"
    assert [s.name for s in spans if s.parent_id not in ids and s.parent_id is not None] == [], "orphan spans"
    assert all(s.trace_id == root.trace_id for s in otlp.spans if s.service == "agents-stream"), "one trace"

    (intake,) = [s for s in named(spans, f"intake {agent}") if s.parent_id == root.span_id]
    w1 = intake.instance
    assert intake.attributes["agents_stream.task_id"] == t["task_id"] and w1
    dispatches = sorted(named(spans, f"dispatch {agent}"), key=lambda s: s.attributes["agents_stream.dispatch"])
    assert [d.attributes["agents_stream.dispatch"] for d in dispatches] == [1, 2]
    assert all(d.parent_id == intake.span_id for d in dispatches), "both attempts under the first intake"
    w2 = dispatches[1].instance
    assert dispatches[0].instance == w1 and w2 and w2 != w1
    redispatched = [e for e in dispatches[1].events if e[0] == "task.redispatched"]
    assert redispatched and redispatched[0][2]["previous_owner"] == w1

    chats = sorted(named(spans, "chat fake-model"), key=lambda s: s.start_ns)
    assert [(ch.parent_id, ch.instance) for ch in chats] == [(dispatches[0].span_id, w1), (dispatches[1].span_id, w2)]
    for ch in chats:
        a = ch.attributes
        assert (a["gen_ai.system"], a["gen_ai.request.model"], a["gen_ai.operation.name"]) == (
            "openai", "fake-model", "chat")
        assert a["gen_ai.usage.input_tokens"] > 0 and a["agents_stream.cost_usd"] > 0
    assert chats[-1].attributes["gen_ai.usage.output_tokens"] > 0  # the answer (the tool-call turn has no text)
    (lookup,) = named(spans, "execute_tool lookup_order")
    assert lookup.parent_id == dispatches[0].span_id and lookup.status != 2
    assert lookup.attributes["agents_stream.idempotency_key"] == f"{t['task_id']}:0:c1"
    (ended,) = named(spans, f"result {agent}")
    assert ended.parent_id == intake.span_id and ended.instance == w2
    assert ended.attributes["agents_stream.result.status"] == "succeeded" and ended.status != 2
    for again in named(spans, f"intake {agent}"):  # worker 2 read the message again: under the task's trace too
        assert again is intake or (again.parent_id == intake.span_id and again.instance == w2)

    screenshot(spans, f"One task, one trace: {t['task_id'][:8]}… across a worker killed mid-call", tmp_path,
               [(killed_ns, "worker 1 SIGKILLed (turn 1's model call in flight: its span is lost)")])
