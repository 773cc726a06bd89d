"""The README's ways in: `agents-stream publish` and Kafka's own console producer through scripts/kafka-tool."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from agents_stream.contract import topics

from .harness import BOOTSTRAP, ROOT, results_for, task, unique


async def test_publish_command_sends_json_lines_that_get_results(cluster_factory, fake_llm, tmp_path):
    """`agents-stream publish --agent NAME FILE` → one result per line; a bad line is reported, not sent."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url)
    w = await c.started()
    ts = [task(agent, n=i) for i in range(3)]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in ts) + "\nnot json\n")
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "agents_stream.ops.cli", "publish", "--agent", agent, str(path)],
        env={**w.env}, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert proc.returncode == 1 and "line 4" in proc.stderr and "published 3 task(s)" in proc.stderr
    ids = {t["task_id"] for t in ts}
    results = await results_for(ids, timeout=60)
    assert set(results) == ids


async def test_publish_paces_to_the_rate_and_shows_progress(cluster_factory, fake_llm, tmp_path):
    """`publish --rate 20` of 30 tasks takes at least 1.45 s (it may never go faster), draws a progress bar with
    --progress, and --json prints one summary; every task gets its result."""
    agent = unique("paced")
    c = cluster_factory([agent], fake_llm.url)
    w = await c.started()
    ts = [task(agent, n=i) for i in range(30)]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in ts) + "\n")
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "agents_stream.ops.cli", "publish", "--agent", agent, "--rate", "20", "--progress",
         "--json", str(path)],
        env={**w.env}, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["published"] == 30 and summary["skipped"] == 0 and summary["topic"] == topics.task_topic(agent)
    assert summary["seconds"] >= 29 / 20, "30 tasks at 20/s: the last leaves 1.45 s after the first"
    assert "[" + "#" * 30 + "] 30/30" in proc.stderr and "tasks/s" in proc.stderr, proc.stderr
    assert set(await results_for({t["task_id"] for t in ts}, timeout=60)) == {t["task_id"] for t in ts}


async def test_console_producer_example_from_the_readme_gets_a_result(cluster_factory, fake_llm):
    """Kafka's console producer (no key) through scripts/kafka-tool → one succeeded result."""
    agent = unique("analyzer")
    c = cluster_factory([agent], fake_llm.url)
    await c.started()
    t = task(agent)
    proc = await asyncio.to_thread(
        subprocess.run,
        [str(ROOT / "scripts" / "kafka-tool"), "console-producer", "--bootstrap-server", BOOTSTRAP,
         "--topic", topics.task_topic(agent)],
        input=json.dumps(t) + "\n", capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    results = await results_for({t["task_id"]}, timeout=60)
    assert json.loads(results[t["task_id"]][0].value)["status"] == "succeeded"
