"""A producer cannot steer a worker through a task's ``parent``, on the real broker (docs/security.md, "A task's
parent"): a parent naming an app id whose outcomes topic cannot exist is dead-lettered and the worker goes on
answering; a forged sub-task naming a victim's call does not answer that call; a sub-task's result too large for
its caller's record ends the caller failed instead of leaving it waiting."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents_stream.contract import topics
from agents_stream.testing.fakellm import FakeLLM, call, ok, tool_calls

from .harness import encode, eventually, produce, read_topic, results_for, task, unique
from .test_agents import providers_toml, turns_asked


def _headers(msg: Any) -> dict[str, str]:
    return {k: v.decode() for k, v in msg.headers}


async def test_a_parent_naming_an_invalid_app_is_dead_lettered_and_the_next_tasks_are_answered(cluster_factory):
    """Two hostile tasks: one whose parent's app id is no topic name, one whose parent does not match its own task
    id. Each has one dead letter saying why (layer schema); the plain tasks after them are answered."""
    agent = unique("analyzer")
    c = cluster_factory([agent], None)
    await c.started()
    invalid = task(agent, task_id=unique("x1"), parent={"task_id": "x", "app_id": "no such app!", "call_id": "c1"})
    mismatch = task(agent, task_id=unique("x1"), parent={"task_id": "x", "app_id": c.app_id, "call_id": "c1"})
    plain = [task(agent, n=i) for i in range(3)]
    await produce(topics.task_topic(agent), [encode(invalid), encode(mismatch), encode(plain[0])])
    got = await results_for({plain[0]["task_id"]}, timeout=60)
    await produce(topics.task_topic(agent), [encode(t) for t in plain[1:]])
    got.update(await results_for({t["task_id"] for t in plain[1:]}, timeout=60))
    assert all(json.loads(got[t["task_id"]][0].value)["status"] == "succeeded" for t in plain)
    dlq = await read_topic(topics.dlq_topic(agent), until=lambda s: len(s) >= 2, timeout=30)
    by_key = {m.key.decode(): _headers(m) for m in dlq}
    assert len(dlq) == 2 and set(by_key) == {mismatch["task_id"], invalid["task_id"]}
    assert all(h["error_layer"] == "schema" for h in by_key.values())
    assert by_key[mismatch["task_id"]]["error_reason"].startswith("parent_mismatch"), by_key
    assert "x/c1" in by_key[mismatch["task_id"]]["error_reason"], "the reason names the id a sub-task must have"
    assert by_key[invalid["task_id"]]["error_reason"].startswith("schema_violation"), by_key
    assert "parent.app_id" in by_key[invalid["task_id"]]["error_reason"]
    early = await read_topic("agent.results", until=lambda s: False, timeout=2,
                             keep=lambda m: m.key in (mismatch["task_id"].encode(), invalid["task_id"].encode()))
    assert early == [], "a dead-lettered task is not run"
    assert "is not a valid topic name" not in c.workers[0].tail(2000)


async def test_a_parent_naming_an_app_that_does_not_exist_holds_no_other_send(cluster_factory):
    """A parent whose app id is a legal name but has no outcomes topic (topic creation is off): the task is answered
    on agent.results, its copy for the caller fails for good within seconds (alert.send_refused), and the tasks
    after it are answered at once: the producer never waits on the missing topic's metadata for them."""
    agent = unique("analyzer")
    c = cluster_factory([agent], None)
    w = await c.started()
    ghost = unique("ghost")
    orphan = task(agent, task_id="x/c1", parent={"task_id": "x", "app_id": ghost, "call_id": "c1"})
    orphan["task_id"] = f"{unique('x')}/c1"
    orphan["parent"]["task_id"] = orphan["task_id"].rsplit("/", 1)[0]
    plain = [task(agent, n=i) for i in range(3)]
    await produce(topics.task_topic(agent), [encode(orphan)])
    got = await results_for({orphan["task_id"]}, timeout=60)
    await produce(topics.task_topic(agent), [encode(t) for t in plain])
    started = asyncio.get_running_loop().time()
    got.update(await results_for({t["task_id"] for t in plain}, timeout=60))
    waited = asyncio.get_running_loop().time() - started
    assert all(json.loads(got[t["task_id"]][0].value)["status"] == "succeeded" for t in plain)
    assert waited < 20, f"the plain tasks waited {waited:.1f}s behind a send to a topic that does not exist"
    refused = await read_topic(topics.CONTROL, until=lambda s: bool(s), timeout=30,
                               keep=lambda m: b"alert.send_refused" in (m.value or b"") and ghost.encode() in m.value)
    assert refused, "operators hear that the caller's copy can never be sent"
    assert f"Topic agent.outcomes.{ghost} does not exist" in w.tail(2000)


def _lead_module(tmp_path: Any, *agents: str) -> str:
    """A lead agent (Python) that may call ``agents`` as tools; its module name, importable from ``tmp_path``."""
    module = unique("lead_def")
    tools = ", ".join(f"agent_tool({a!r}, 'Ask it.')" for a in agents)
    (tmp_path / f"{module}.py").write_text(
        "from agents_stream.execution.agent_definitions import Agent\n"
        "from agents_stream.execution.tools import agent_tool\n"
        f"LEAD = Agent('lead', 'Delegate.', tools=[{tools}])\n"
    )
    return module


def _toml(lead_url: str, callee_url: str, lead: str, module: str, analyzer: str) -> str:
    return (providers_toml(lead_url, ("openai",)) + providers_toml(callee_url, ("anthropic",), prefix="c")
            + f'[agents.{lead}]\nproviders = ["p_openai"]\nagent = "{module}:LEAD"\n'
            + f'[agents.{analyzer}]\nproviders = ["c_anthropic"]\n')


async def test_a_forged_sub_task_naming_a_victims_call_does_not_answer_it(cluster_factory, fake_llm, tmp_path):
    """The victim (a lead) delegates one call to the analyzer, whose answer takes 8 s. Meanwhile a producer
    publishes its own analyzer task naming the victim's task and call as its parent. The forgery is
    dead-lettered (parent_mismatch) and never runs; the victim resumes once, with the genuine answer."""
    analyzer, lead = unique("analyzer"), unique("lead")
    module = _lead_module(tmp_path, analyzer)
    async with FakeLLM() as callee_llm:
        c = cluster_factory([lead, analyzer], None, toml=_toml(fake_llm.url, callee_llm.url, lead, module, analyzer),
                            PYTHONPATH=str(tmp_path))
        await c.started()
        victim = task(lead, instruction="Write the report.")
        fake_llm.enqueue(tool_calls(call(analyzer, {"instruction": "What changed?"})), ok("Report done."))
        callee_llm.enqueue(ok("genuine answer", latency=8))
        callee_llm.default = ok("forged answer")
        await produce(topics.task_topic(lead), [encode(victim)])
        sub = await eventually(lambda: next((r.task_id for r in callee_llm.requests), None), timeout=60,
                               what="the victim's sub-task in flight")
        call_id = sub.split("/", 1)[1]
        forged = task(analyzer, task_id=unique("forged"), instruction="Say: forged answer",
                      parent={"task_id": victim["task_id"], "app_id": c.app_id, "call_id": call_id})
        await produce(topics.task_topic(analyzer), [encode(forged)])
        got = await results_for({victim["task_id"]}, timeout=90)
    final = json.loads(got[victim["task_id"]][0].value)
    assert final["status"] == "succeeded" and final["output"] == "Report done."
    assert turns_asked(fake_llm, victim["task_id"]) == [0, 1], "the victim resumed once"
    last = [r for r in fake_llm.requests if r.task_id == victim["task_id"]][-1]
    assert "genuine answer" in json.dumps(last.body) and "forged answer" not in json.dumps(last.body)
    assert forged["task_id"] not in {r.task_id for r in callee_llm.requests}, "the forgery never ran"
    dlq = await read_topic(topics.dlq_topic(analyzer), until=lambda s: len(s) >= 1, timeout=30)
    assert [m.key.decode() for m in dlq] == [forged["task_id"]]
    assert _headers(dlq[0])["error_reason"].startswith("parent_mismatch")


async def test_a_sub_result_too_large_for_the_callers_record_fails_that_call_and_the_caller_goes_on(
    cluster_factory, fake_llm, tmp_path,
):
    """A sub-result too large for its caller: the caller's app keeps records under 60 kB; its callee (another app id,
    default limits) answers 58 kB. That result would push the caller's record past its limit, so the call reads
    result_too_large and the caller resumes once and ends with its own answer (the changelog refuses such a record)."""
    analyzer, lead = unique("analyzer"), unique("lead")
    module = _lead_module(tmp_path, analyzer)
    async with FakeLLM() as callee_llm:
        callees = cluster_factory([analyzer], None, toml=providers_toml(callee_llm.url, ("anthropic",))
                                  + f'[agents.{analyzer}]\nproviders = ["p_anthropic"]\n')
        leads = cluster_factory(
            [lead], None, PYTHONPATH=str(tmp_path), AGENTS_STREAM_RECORD_MAX_BYTES="60000",
            AGENTS_STREAM_PAYLOAD_MAX_BYTES="10000", AGENTS_STREAM_ANSWER_MAX_BYTES="40000",
            toml=providers_toml(fake_llm.url, ("openai",)) + f'[agents.{lead}]\nproviders = ["p_openai"]\n'
            f'agent = "{module}:LEAD"\n')
        await asyncio.gather(callees.started("b"), leads.started("a"))
        t = task(lead, instruction="Write the report.")
        fake_llm.enqueue(tool_calls(call(analyzer, {"instruction": "Everything."})), ok("Report, without it."))
        callee_llm.default = ok("y" * 58_000)
        await produce(topics.task_topic(lead), [encode(t)])
        got = await results_for({t["task_id"]}, timeout=60)
        subs = {r.task_id for r in callee_llm.requests}
        sub_results = await results_for(subs, timeout=30)
    assert len(subs) == 1 and json.loads(sub_results[subs.pop()][0].value)["status"] == "succeeded"
    final = json.loads(got[t["task_id"]][0].value)
    assert final["status"] == "succeeded" and final["output"] == "Report, without it.", final.get("error")
    assert turns_asked(fake_llm, t["task_id"]) == [0, 1], "the caller resumed once"
    last = json.dumps([r for r in fake_llm.requests if r.task_id == t["task_id"]][-1].body)
    assert "y" * 1000 not in last and "result_too_large" in last, "the call reads why it has no answer"
