"""Cancelling on the real broker: a lead agent waiting for two sub-tasks that another app's worker is running is
cancelled over HTTP; the cancel reaches both sub-tasks, their calls stop and free their slots, and every task ends
once, cancelled. A task cancelled from the CLI before it was published never runs."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from urllib.parse import quote

import aiohttp

from agents_stream.contract import topics
from agents_stream.testing.fakellm import FakeLLM, call, ok, tool_calls

from .harness import BOOTSTRAP, ROOT, encode, eventually, produce, results_for, task, unique
from .test_agents import providers_toml

SECRET = "cancel-secret-" + "x" * 24
TOKEN = "cancel-token"


async def test_a_cancelled_lead_cancels_its_running_subtasks_and_an_early_cancel_stops_a_task_before_it_runs(
    cluster_factory, fake_llm, tmp_path,
):
    analyzer, summarizer, plain, lead = unique("analyzer"), unique("summarizer"), unique("plain"), unique("lead")
    module = unique("lead_def")
    (tmp_path / f"{module}.py").write_text(
        "from agents_stream.execution.agent_definitions import Agent\n"
        "from agents_stream.execution.tools import agent_tool\n"
        f"LEAD = Agent('lead', 'Delegate.', tools=[agent_tool({analyzer!r}, 'Analyse.'), "
        f"agent_tool({summarizer!r}, 'Summarise.')])\n"
    )
    secrets = {"AGENTS_STREAM_APPROVAL_SECRET": SECRET, "AGENTS_STREAM_API_TOKEN": TOKEN}
    async with FakeLLM() as callee_llm:
        callee_toml = providers_toml(callee_llm.url, ("anthropic",)) + "".join(
            f'[agents.{a}]\nproviders = ["p_anthropic"]\n' for a in (analyzer, summarizer, plain))
        # two call slots: both taken by the sub-tasks until the cancel frees them
        callees = cluster_factory([analyzer, summarizer, plain], None, toml=callee_toml,
                                  AGENTS_STREAM_MAX_IN_FLIGHT="2", **secrets)
        lead_toml = (providers_toml(fake_llm.url, ("openai",))
                     + f'[agents.{lead}]\nproviders = ["p_openai"]\nagent = "{module}:LEAD"\n')
        leads = cluster_factory([lead], None, toml=lead_toml, PYTHONPATH=str(tmp_path), **secrets)
        callee, lead_worker = await asyncio.gather(callees.started("b"), leads.started("a"))
        t = task(lead, instruction="Write the report.")
        fake_llm.enqueue(tool_calls(call(analyzer, {"instruction": "What changed?"}),
                                    call(summarizer, {"instruction": "Summarise it."})),
                         ok("never asked"))
        await callee_llm.set_mode(latency=120)  # both sub-tasks' model calls hang
        await produce(topics.task_topic(lead), [encode(t)])
        await eventually(lambda: len({r.task_id for r in callee_llm.requests}) == 2, timeout=60,
                         what="both sub-tasks running")
        subs = {r.task_id for r in callee_llm.requests}

        url = f"http://127.0.0.1:{lead_worker.web_port}/tasks/{quote(t['task_id'], safe='')}/cancel"
        async with aiohttp.ClientSession() as s:
            async with s.post(url, json={"by": "ops"}) as r:
                assert r.status == 401, "a cancel needs the write token"
            async with s.post(url, json={"by": "ops", "reason": "wrong document"},
                              headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                assert r.status == 202, await r.text()
        got = await results_for({t["task_id"], *subs}, timeout=60)
        await callee_llm.set_mode(latency=0)
        callee_llm.default = ok("too late")
        after = task(plain, instruction="Anything.")
        await produce(topics.task_topic(plain), [encode(after)])
        freed = await results_for({after["task_id"]}, timeout=20)  # the two slots are free again
        assert json.loads(freed[after["task_id"]][0].value)["status"] == "succeeded"
        await asyncio.sleep(3)  # time for anything wrongly still running to answer
        late = await results_for({t["task_id"], *subs}, timeout=5)

        lead_result = json.loads(got[t["task_id"]][0].value)
        assert (lead_result["status"], lead_result["source"], lead_result["error"]) == (
            "failed", "cancel", "cancelled by ops: wrong document")
        for sub in subs:
            ended = json.loads(got[sub][0].value)
            assert (ended["source"], ended["error"]) == (
                "cancel", f"cancelled by ops: wrong document (its caller {t['task_id']} was cancelled)"), ended
        assert all(len({m.value for m in late[i]}) == 1 for i in (t["task_id"], *subs)), (
            "each task ended once, cancelled: the stopped calls never answered"
        )
        assert [r.task_id for r in callee_llm.requests if r.task_id in subs].__len__() == 2, "no sub-task ran again"
        assert len([r for r in fake_llm.requests if r.task_id == t["task_id"]]) == 1, "the lead never resumed"
        shown = await lead_worker.get(f"/tasks/{quote(t['task_id'], safe='')}")
        assert shown["state"] == "cancelled" and shown["cancel"]["by"] == "ops" and shown["cancel"]["via"] == "http"

        early = task(plain, instruction="Never.")
        env = {**os.environ, "KAFKA_BROKER": f"kafka://{BOOTSTRAP}", "AGENTS_STREAM_APPROVAL_SECRET": SECRET,
               "AGENTS_STREAM_APP_ID": callees.app_id}  # a cancel names the app id whose task it ends
        out = subprocess.run(
            [sys.executable, "-m", "agents_stream.ops.cli", "tasks", "cancel", early["task_id"], "--agent", plain,
             "--by", "ops", "--reason", "not needed"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "signed" in out.stdout, out.stderr
        await eventually(lambda: _state(callee, early["task_id"], "cancelled"), timeout=30,
                         what="the early cancel recorded")
        await produce(topics.task_topic(plain), [encode(early)])
        ended = json.loads((await results_for({early["task_id"]}, timeout=30))[early["task_id"]][0].value)
        assert ended["error"] == "cancelled by ops: not needed" and ended["source"] == "cancel"
        assert not any(r.task_id == early["task_id"] for r in callee_llm.requests), "it never reached the model"


async def _state(worker, task_id: str, state: str) -> bool:
    body = await worker.get(f"/tasks/{quote(task_id, safe='')}")
    return isinstance(body, dict) and body.get("state") == state
