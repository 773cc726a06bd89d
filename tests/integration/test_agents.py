"""Agents that act, on the real broker: the support agent's tool-calling loop in worker processes, the fake LLM
and the example services over HTTP; SIGKILLs after a refund and during one."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from agents_stream import Agent
from agents_stream.contract import topics
from agents_stream.examples.services import FakeServices
from agents_stream.examples.support import SUPPORT as SUPPORT_AGENT
from agents_stream.testing import replay
from agents_stream.testing.fakellm import FakeLLM, call, hang, ok, tool_calls

from .harness import all_committed, encode, eventually, produce, results_for, task, unique

SUPPORT = "agents_stream.examples.support:SUPPORT"
APIS = ("openai", "anthropic", "gemini")


def providers_toml(url: str, apis: tuple[str, ...] = APIS, *, prefix: str = "p") -> str:
    out = []
    for api in apis:
        base = f"{url}/v1" if api == "openai" else url
        out += [f"[providers.{prefix}_{api}]", f'kind = "{api}"', f'base_url = "{base}"', 'model = "fake-model"',
                "timeout_s = 10", ""]
    return "\n".join(out)


def agent_toml(agent: str, providers: list[str], approval_timeout_s: float = 600) -> str:
    listed = ", ".join(f'"{p}"' for p in providers)
    return (f'[agents.{agent}]\nproviders = [{listed}]\nagent = "{SUPPORT}"\n'
            f'[[agents.{agent}.approval.levels]]\nname = "lead"\ntimeout_s = {approval_timeout_s}\n')


def support_script(order_id: str) -> list[Any]:
    """Look up → label and refund (two calls in one turn) → notify → the answer."""
    return [
        tool_calls(call("lookup_order", {"order_id": order_id})),
        tool_calls(call("create_label", {"order_id": order_id}),
                   call("refund", {"order_id": order_id, "amount": 42.5})),
        tool_calls(call("notify_customer", {"email": "customer@example.com", "text": "Refunded 42.50"})),
        ok("Refunded 42.50 and sent a return label."),
    ]


def turn_of(request: Any) -> int:
    """Which turn a model request asks for: the number of the model's own turns it carries."""
    body = request.body or {}
    if request.api == "gemini":
        return sum(1 for c in body.get("contents", []) if c.get("role") == "model")
    return sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")


def turns_asked(fake: FakeLLM, task_id: str) -> list[int]:
    return [turn_of(r) for r in fake.requests if r.task_id == task_id]


def order_task(agent: str) -> dict[str, Any]:
    t = task(agent, instruction="The customer wants a refund for their order.")
    t["context_data"] = {"order_id": unique("o")}
    return t


async def result_of(t: dict[str, Any], timeout: float = 90) -> dict[str, Any]:
    return json.loads((await results_for({t["task_id"]}, timeout=timeout))[t["task_id"]][0].value)


async def test_the_support_loop_calls_the_right_tools_in_order_in_each_wire_format(cluster_factory, fake_llm):
    """The same scripted conversation through OpenAI, Anthropic and Gemini wire formats: each task calls lookup →
    label + refund → notify with the model's arguments, answers once, and carries its transcript."""
    async with FakeServices() as services:
        agents = {api: unique(f"support_{api}") for api in APIS}
        toml = providers_toml(fake_llm.url) + "\n".join(agent_toml(a, [f"p_{api}"]) for api, a in agents.items())
        c = cluster_factory(list(agents.values()), None, toml=toml, AGENTS_STREAM_REFUND_SERVICES=services.url)
        await c.started()
        for api, agent in agents.items():
            t = order_task(agent)
            order_id = t["context_data"]["order_id"]
            fake_llm.enqueue(*support_script(order_id))
            await produce(topics.task_topic(agent), [encode(t)])
            result = await result_of(t)
            mine = [x for x in services.calls if x.key.startswith(t["task_id"] + ":")]
            assert [x.operation for x in mine][:1] == ["orders.lookup"], api
            assert sorted(x.operation for x in mine[1:3]) == ["carrier.label", "payment.refund"], api
            assert [x.operation for x in mine[3:]] == ["mail.send"], api
            refund = next(x for x in mine if x.operation == "payment.refund")
            assert refund.key.startswith(f"{t['task_id']}:1:"), "the key is <task_id>:<turn>:<call_id>"
            assert result["status"] == "succeeded" and result["output"] == "Refunded 42.50 and sent a return label."
            assert result["confidence"] == "high" and result["source"].startswith(f"primary:p_{api}:")
            summary = result["transcript"]
            assert [tt["tool_calls"] for tt in summary["turns"]] == [
                ["lookup_order"], ["create_label", "refund"], ["notify_customer"], []]
            assert not any(x["error"] for x in summary["tool_calls"]) and result["usage"]["input_tokens"] > 0
            # the worker's result replays against the agent's code in the test harness, and a tool set without
            # refund diverges at its call (agents_stream.testing.replay)
            assert not (await replay(SUPPORT_AGENT, result)).diverged
            without = Agent("support", instructions=SUPPORT_AGENT.instructions,
                            tools=[t for t in SUPPORT_AGENT.tools if t.name != "refund"])
            first = (await replay(without, result)).first
            assert first is not None and (first.turn, first.tool) == (1, "refund"), first
            assert turns_asked(fake_llm, t["task_id"]) == [0, 1, 2, 3], api
            last = [r for r in fake_llm.requests if r.task_id == t["task_id"]][-1]
            assert "Refunded 42.50" in json.dumps(last.body) and "mail.send" in json.dumps(last.body), (
                "the last turn sees every tool result")
            print(f"\nagents: {api}: {[x.operation for x in mine]} → {result['output']!r}")


async def test_a_worker_killed_after_the_refund_resumes_without_a_second_refund(cluster_factory, fake_llm):
    """SIGKILL after `refund` succeeded and its result was journaled, while the next model turn is in flight: the
    restarted worker asks only that turn again (turns 0 and 1 are not requested again), the payment service saw one
    refund, and the task finishes once."""
    async with FakeServices() as services:
        agent = unique("support")
        toml = providers_toml(fake_llm.url, ("openai",)) + agent_toml(agent, ["p_openai"])
        c = cluster_factory([agent], None, toml=toml, AGENTS_STREAM_REFUND_SERVICES=services.url)
        t = await kill_after_the_refund_is_journaled(c, agent, fake_llm, services)
        result = await result_of(t)
        asked = turns_asked(fake_llm, t["task_id"])
        refunds = [x for x in services.calls if x.operation == "payment.refund" and x.key.startswith(t["task_id"])]
        print(f"\nagents: turns asked {asked}; refund calls {[(x.key, x.replay) for x in refunds]}")
        assert result["status"] == "succeeded"
        assert asked == [0, 1, 2, 2, 3], "only the turn in flight at the kill is asked again"
        assert len(refunds) == 1 and len(services.executed("payment.refund")) == 1


async def test_a_tool_call_cut_by_a_kill_runs_again_with_its_key_and_applies_once(cluster_factory, fake_llm):
    """SIGKILL while `refund` is in flight (it took effect, its answer is slow): the restarted worker calls it again
    with the same idempotency key; the service answers the replay and applies nothing twice."""
    async with FakeServices() as services:
        agent = unique("support")
        toml = providers_toml(fake_llm.url, ("anthropic",)) + agent_toml(agent, ["p_anthropic"])
        c = cluster_factory([agent], None, toml=toml, AGENTS_STREAM_REFUND_SERVICES=services.url)
        await c.started("a")
        t = order_task(agent)
        script = support_script(t["context_data"]["order_id"])
        fake_llm.enqueue(*script)
        services.delay("payment.refund", 30.0)
        await produce(topics.task_topic(agent), [encode(t)])
        await eventually(lambda: services.executed("payment.refund"), timeout=60, what="refund in flight")
        c.workers[0].kill()
        services.delay("payment.refund", 0)
        await c.started("a")
        result = await result_of(t)
        refunds = [x for x in services.calls if x.operation == "payment.refund" and x.key.startswith(t["task_id"])]
        assert result["status"] == "succeeded"
        assert [x.replay for x in refunds] == [False, True] and len({x.key for x in refunds}) == 1, refunds
        labels = [x for x in services.calls if x.operation == "carrier.label" and x.key.startswith(t["task_id"])]
        assert len(labels) == 1, "the label, journaled before the kill, is not requested again"
        assert turns_asked(fake_llm, t["task_id"]) == [0, 1, 2, 3], "no model turn is asked twice"


async def test_the_alternate_carries_the_conversation_when_the_primary_goes_down(cluster_factory):
    """The primary (OpenAI format) answers turns 0-2 and then fails every call: turn 3 is asked of the alternate
    (Anthropic format) with the whole transcript translated; one result, confidence medium."""
    async with FakeServices() as services, FakeLLM() as primary, FakeLLM() as alternate:
        agent = unique("support")
        toml = (providers_toml(primary.url, ("openai",), prefix="one") + providers_toml(alternate.url, ("anthropic",),
                                                                                        prefix="two")
                + agent_toml(agent, ["one_openai", "two_anthropic"]))
        c = cluster_factory([agent], None, toml=toml, AGENTS_STREAM_REFUND_SERVICES=services.url,
                            AGENTS_STREAM_MAX_RETRIES="1")
        await c.started()
        t = order_task(agent)
        script = support_script(t["context_data"]["order_id"])
        primary.enqueue(*script[:3])
        primary.default = None  # past the script: every call fails (500)
        alternate.enqueue(script[3])
        await produce(topics.task_topic(agent), [encode(t)])
        result = await result_of(t)
        assert result["status"] == "succeeded" and result["confidence"] == "medium"
        assert result["source"].startswith("alternate:two_anthropic:")
        carried = [r for r in alternate.requests if r.task_id == t["task_id"]]
        assert len(carried) == 1 and turn_of(carried[0]) == 3
        body = json.dumps(carried[0].body)
        assert "tool_use" in body and "tool_result" in body and "payment.refund" in body
        assert [x["source"].split(":")[0] for x in result["transcript"]["turns"]] == [
            "primary", "primary", "primary", "alternate"]
        assert len(services.executed("payment.refund")) == 1


async def test_a_large_refund_parks_at_its_call_until_a_human_decides_and_a_huge_result_ends_its_task(
    cluster_factory, fake_llm,
):
    """Two tickets whose refunds are over the agent's approval rule: each parks at its refund call (the task's
    offsets committed: lag 0 behind it, no slot held), the label of the same turn is made. Approve the first over
    HTTP → one refund, the loop finishes; reject the second → no refund, and the model's next turn reads the
    rejection. Then a 2 MB tool result: journal_too_large, and the partition keeps moving."""
    token = "agents-test-token"
    async with FakeServices() as services:
        agent = unique("support")
        toml = providers_toml(fake_llm.url, ("openai",)) + agent_toml(agent, ["p_openai"])
        c = cluster_factory([agent], None, toml=toml, AGENTS_STREAM_REFUND_SERVICES=services.url,
                            AGENTS_STREAM_API_TOKEN=token)
        w = await c.started()
        tickets = [order_task(agent), order_task(agent)]
        for t in tickets:
            order_id = t["context_data"]["order_id"]
            fake_llm.enqueue(tool_calls(call("lookup_order", {"order_id": order_id})),
                             tool_calls(call("create_label", {"order_id": order_id}),
                                        call("refund", {"order_id": order_id, "amount": 420.0})))
            await produce(topics.task_topic(agent), [encode(t)], partition=0)
            await eventually(lambda t=t: 1 in turns_asked(fake_llm, t["task_id"]), timeout=60, what="turn 1")
        waiting = await eventually(lambda: _awaiting(w, 2), timeout=60, what="both refunds parked")
        assert all(a["reason"] == "tool refund: amount 420 > 100" for a in waiting), waiting
        await all_committed(c.app_id, topics.task_topic(agent), what="offsets committed past the parked tasks")
        assert len([x for x in services.calls if x.operation == "carrier.label"]) == 2, "the label of the turn ran"
        assert not services.executed("payment.refund")
        approved, rejected = tickets
        fake_llm.enqueue(ok("Refunded 420."), ok("I could not refund: a lead said no."))
        parked = {a["task_id"]: a["parked"] for a in waiting}  # what the inbox showed
        for t, decision in ((approved, "approve"), (rejected, "reject")):
            url = f"http://127.0.0.1:{w.web_port}/approvals/{t['task_id']}"
            async with aiohttp.ClientSession() as s, s.post(
                url, json={"decision": decision, "by": "lead-ann", "comment": "over budget",
                           "parked": parked[t["task_id"]]},
                headers={"Authorization": f"Bearer {token}"},
            ) as r:
                assert r.status == 202, await r.text()
            result = await result_of(t)
            assert result["status"] == "succeeded", result
        refunds = services.executed("payment.refund")
        assert len(refunds) == 1 and refunds[0].startswith(approved["task_id"] + ":1:"), refunds
        last = [r for r in fake_llm.requests if r.task_id == rejected["task_id"]][-1]
        assert "rejected by lead-ann: over budget" in json.dumps(last.body)
        assert turns_asked(fake_llm, approved["task_id"]) == [0, 1, 2], "no turn is asked again after the wait"

        # The same worker: a tool answering 2 MB (more than the agent keeps) ends its task with journal_too_large,
        # and the next task of the agent is answered.
        big, nxt = order_task(agent), order_task(agent)
        services.pad_orders(2_000_000)
        fake_llm.enqueue(tool_calls(call("lookup_order", {"order_id": big["context_data"]["order_id"]})),
                         ok("nothing to do"))
        await produce(topics.task_topic(agent), [encode(big)])
        first = await result_of(big)
        await produce(topics.task_topic(agent), [encode(nxt)])
        second = await result_of(nxt)
    assert first["status"] == "failed" and "journal_too_large" in first["error"], first["error"]
    assert second["status"] == "succeeded" and second["output"] == "nothing to do"


async def _awaiting(worker: Any, n: int) -> list[dict[str, Any]] | None:
    waiting = (await worker.get("/approvals"))["awaiting"]
    return waiting if len(waiting) == n else None


async def test_a_lead_delegates_to_agents_of_another_app_and_resumes_once_after_a_callee_kill(
    cluster_factory, fake_llm, tmp_path,
):
    """The lead (app 1) calls an analyzer and a summarizer run by app 2 (agents as tools): two sub-tasks; app 2's
    worker is SIGKILLed while both are in flight. After its restart each sub-task has one result, the lead resumes
    once (its turn 1 is asked once, with both answers) and has one final result."""
    analyzer, summarizer, lead = unique("analyzer"), unique("summarizer"), unique("lead")
    module = unique("lead_def")
    (tmp_path / f"{module}.py").write_text(
        "from agents_stream.execution.agent_definitions import Agent\n"
        "from agents_stream.execution.tools import agent_tool\n"
        f"LEAD = Agent('lead', 'Delegate.', tools=[agent_tool({analyzer!r}, 'Analyse.'), "
        f"agent_tool({summarizer!r}, 'Summarise.')])\n"
    )
    async with FakeLLM() as callee_llm:
        callee_toml = providers_toml(callee_llm.url, ("anthropic",)) + "".join(
            f'[agents.{a}]\nproviders = ["p_anthropic"]\n' for a in (analyzer, summarizer))
        callees = cluster_factory([analyzer, summarizer], None, toml=callee_toml)
        lead_toml = (providers_toml(fake_llm.url, ("openai",))
                     + f'[agents.{lead}]\nproviders = ["p_openai"]\nagent = "{module}:LEAD"\n')
        leads = cluster_factory([lead], None, toml=lead_toml, PYTHONPATH=str(tmp_path))
        await asyncio.gather(callees.started("b"), leads.started("a"))
        t = task(lead, instruction="Write the report.", context_data={"doc": "Q3 revenue grew 12%."})
        fake_llm.enqueue(tool_calls(call(analyzer, {"instruction": "What changed?", "context": {"doc": "Q3"}}),
                                    call(summarizer, {"instruction": "Summarise it."})),
                         ok("Report: growth, summarised."))
        await callee_llm.set_mode(latency=60)  # both sub-tasks' calls hang until the kill
        await produce(topics.task_topic(lead), [encode(t)])
        await eventually(lambda: len({r.task_id for r in callee_llm.requests}) == 2, timeout=60,
                         what="both sub-tasks in flight")
        subs = {r.task_id for r in callee_llm.requests}
        assert all(s.startswith(t["task_id"] + "/") for s in subs), subs
        callees.workers[0].kill()
        await callee_llm.set_mode(latency=0)
        callee_llm.default = ok("callee answer")
        await callees.started("b")  # its leases lapse and the sub-tasks run again
        got = await results_for({*subs, t["task_id"]}, timeout=120)
    assert all(len({m.value for m in got[s]}) == 1 for s in subs), "one distinct result per sub-task"
    lead_results = {m.value for m in got[t["task_id"]]}
    assert len(lead_results) == 1
    final = json.loads(next(iter(lead_results)))
    assert final["status"] == "succeeded" and final["output"] == "Report: growth, summarised."
    assert turns_asked(fake_llm, t["task_id"]) == [0, 1], "the lead resumed once"
    last = [r for r in fake_llm.requests if r.task_id == t["task_id"]][-1]
    assert json.dumps(last.body).count("callee answer") == 2, "turn 1 reads both sub-tasks' answers"
    assert {x["name"] for x in final["transcript"]["tool_calls"]} == {analyzer, summarizer}
    assert not any(x["error"] for x in final["transcript"]["tool_calls"])


async def test_a_tool_failing_every_call_opens_its_breaker_and_the_model_is_told(cluster_factory, fake_llm, tmp_path):
    """A carrier that answers 503 to everything, asked for in each of 8 turns: its breaker (threshold 3, shared
    through agent.circuits) opens after a bounded number of calls; the later turns are told it is unavailable
    without a call; the task still ends with one result."""
    module = unique("shipper_def")
    (tmp_path / f"{module}.py").write_text(
        "import os\nimport aiohttp\n"
        "from agents_stream.contract.errors import TransientError\n"
        "from agents_stream.execution.agent_definitions import Agent\n"
        "from agents_stream.execution.tools import ToolContext, tool\n\n"
        "@tool(retries=1, breaker={'failure_threshold': 3, 'open_timeout_s': 600})\n"
        "async def carrier(ctx: ToolContext) -> str:\n"
        "    '''Create a shipping label.'''\n"
        "    url = os.environ['AGENTS_STREAM_REFUND_SERVICES'] + '/carrier/label'\n"
        "    key = {'Idempotency-Key': ctx.key}\n"
        "    async with aiohttp.ClientSession() as s, s.post(url, json={}, headers=key) as r:\n"
        "        if r.status >= 500:\n"
        "            raise TransientError(f'carrier answered {r.status}')\n"
        "        return await r.text()\n\n"
        "SHIPPER = Agent('shipper', 'Ship it.', tools=[carrier], max_turns=10, max_tool_errors=10)\n"
    )
    async with FakeServices() as services:
        services.fail("carrier.label", times=1000)
        agent = unique("shipper")
        toml = providers_toml(fake_llm.url, ("openai",)) + (
            f'[agents.{agent}]\nproviders = ["p_openai"]\nagent = "{module}:SHIPPER"\n')
        c = cluster_factory([agent], None, toml=toml, AGENTS_STREAM_REFUND_SERVICES=services.url,
                            PYTHONPATH=str(tmp_path))
        await c.started()
        await fake_llm.set_mode(tool_turns=["carrier"] * 8)
        t = task(agent, instruction="Ship order o-1.")
        await produce(topics.task_topic(agent), [encode(t)])
        result = await result_of(t)
        calls = [x for x in services.calls if x.operation == "carrier.label"]
    print(f"\nagents: 8 turns asked for a carrier failing every call; it was called {len(calls)} times")
    assert result["status"] == "succeeded" and len(result["transcript"]["tool_calls"]) == 8
    assert all(x["error"] for x in result["transcript"]["tool_calls"])
    # without a breaker: 8 turns × 2 attempts = 16 calls; with it about the threshold (3), more only if the log's
    # fold of a failure takes longer than the 2 s a call waits for it
    assert len(calls) <= 8, f"the breaker bounds the calls (threshold 3, 16 without it): {len(calls)}"
    last = [r for r in fake_llm.requests if r.task_id == t["task_id"]][-1]
    assert json.dumps(last.body).count("breaker is open") >= 4, "the later turns were told without a call"


async def kill_after_the_refund_is_journaled(c: Any, agent: str, fake_llm: FakeLLM,
                                             services: FakeServices) -> dict[str, Any]:
    """Start worker "a" of ``c``, publish an order task to ``agent`` (the support script) and SIGKILL the worker once
    the refund took effect and its result is journaled, while turn 2 is in flight; then restart it with the rest of
    the script queued. Returns the task; its result is still to come."""
    await c.started("a")
    t = order_task(agent)
    script = support_script(t["context_data"]["order_id"])
    fake_llm.enqueue(script[0], script[1], hang(60))
    await produce(topics.task_topic(agent), [encode(t)])
    await eventually(lambda: 2 in turns_asked(fake_llm, t["task_id"]), timeout=60, what="turn 2 in flight")
    assert services.executed("payment.refund"), "the refund took effect before the kill"
    # the journal's last entries are confirmed by the broker before turn 2 is asked, and applied by the ledger just
    # after: wait for the view to show them rather than read it once
    progress = await eventually(lambda: _progress(c.workers[0], t["task_id"], calls=3), timeout=10,
                                what="the three tool results in the task's progress")
    assert [tt["tool_calls"] for tt in progress["turns"]] == [["lookup_order"], ["create_label", "refund"]]
    assert sorted(x["name"] for x in progress["tool_calls"]) == ["create_label", "lookup_order", "refund"]
    c.workers[0].kill()
    fake_llm.enqueue(*script[2:])
    await c.started("a")  # the same worker restarted: it takes the task over once the lease lapses
    return t


async def _progress(worker: Any, task_id: str, *, calls: int) -> dict[str, Any] | None:
    """The task's journal as /tasks shows it, once it holds ``calls`` tool results."""
    transcript = ((await worker.get(f"/tasks/{task_id}")).get("progress") or {}).get("transcript") or {}
    return transcript if len(transcript.get("tool_calls", [])) >= calls else None


async def test_a_failed_tool_call_says_why_in_the_result_the_task_view_and_the_log(cluster_factory, fake_llm):
    """issue 29 item 4: a wrong argument name's validation error is in the result's transcript, /tasks/<id> and
    the worker's log, not only `error 0 attempts`."""
    async with FakeServices() as services:
        agent = unique("support_openai")
        toml = providers_toml(fake_llm.url, ("openai",)) + agent_toml(agent, ["p_openai"])
        c = cluster_factory([agent], None, toml=toml, AGENTS_STREAM_REFUND_SERVICES=services.url)
        worker = await c.started()
        t = order_task(agent)
        fake_llm.enqueue(tool_calls(call("lookup_order", {"order": t["context_data"]["order_id"]}, id="c1")),
                         ok("I could not look the order up."))
        await produce(topics.task_topic(agent), [encode(t)])
        result = await result_of(t)
        failed = result["transcript"]["tool_calls"]
        assert [(x["name"], x["error"], x["attempts"]) for x in failed] == [("lookup_order", True, 0)]
        assert failed[0]["detail"].startswith("invalid arguments for lookup_order: order_id: Field required")
        view = await worker.get(f"/tasks/{t['task_id']}")
        assert view["result"]["transcript"]["tool_calls"][0]["detail"] == failed[0]["detail"]
        assert f"Task {t['task_id']}: tool lookup_order (call c1, turn 0) failed" in worker.log_path.read_text()
