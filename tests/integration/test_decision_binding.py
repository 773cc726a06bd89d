"""Decisions bound to what their human saw, on the real broker: a retried approve does not
approve the support agent's next parked refund (over HTTP, the CLI and a raw event), and one app id's decision does
not decide another app id's task of the same id."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from agents_stream.contract import topics
from agents_stream.examples.services import FakeServices
from agents_stream.testing.fakellm import call, ok, tool_calls

from .harness import READ_TOKEN, encode, eventually, produce, results_for, task, unique
from .test_agents import agent_toml, order_task, providers_toml
from .test_approval_bounds import cli, control_events

TOKEN = "decisions-test-token"


async def _parked_at(worker: Any, task_id: str, call_id: str) -> int | None:
    """The task's parking when it awaits approval of ``call_id``; None until then."""
    view = await worker.get(f"/tasks/{task_id}")
    approval = view.get("approval") or {}
    if view.get("state") == "awaiting_approval" and (approval.get("call") or {}).get("id") == call_id:
        return _parking(approval)
    return None


def _parking(shown: dict[str, Any]) -> int:
    """The parking a view shows (``parked``: when it was parked, in ms; a worker that does not show it, of the
    version before decisions named it, is asked the same thing through ``requested_at``)."""
    return int(shown["parked"]) if "parked" in shown else int(round(float(shown["requested_at"]) * 1000))


async def _post(port: int, task_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/approvals/{task_id}"
    async with aiohttp.ClientSession() as s, s.post(url, json=body,
                                                     headers={"Authorization": f"Bearer {TOKEN}"}) as r:
        return r.status, await r.json()


async def test_a_retried_approve_leaves_the_loops_next_refund_parked(cluster_factory, fake_llm):
    """The support loop parks refund(150); an operator approves it over HTTP; the loop refunds and parks
    refund(900). The same approve sent again — over HTTP (409 with the reason), as the event it published (ignored,
    approval.ignored) and from the CLI with that parking (exit 1) — leaves refund(900) parked and unrefunded. The CLI
    without --parked names the current parking and sends nothing; with it, it decides refund(900)."""
    async with FakeServices() as services:
        agent = unique("support")
        toml = providers_toml(fake_llm.url, ("openai",)) + agent_toml(agent, ["p_openai"])
        c = cluster_factory([agent], None, toml=toml, AGENTS_STREAM_REFUND_SERVICES=services.url,
                            AGENTS_STREAM_API_TOKEN=TOKEN)
        w = await c.started()
        t = order_task(agent)
        order_id, task_id = t["context_data"]["order_id"], t["task_id"]
        fake_llm.enqueue(
            tool_calls(call("lookup_order", {"order_id": order_id})),
            tool_calls(call("refund", {"order_id": order_id, "amount": 150.0}, id="call_150")),
            tool_calls(call("refund", {"order_id": order_id, "amount": 900.0}, id="call_900")),
            ok("Refunded 150 and 900."),
        )
        await produce(topics.task_topic(agent), [encode(t)], partition=0)
        first = await eventually(lambda: _parked_at(w, task_id, "call_150"), timeout=60, what="refund(150) parked")
        approve = {"decision": "approve", "by": "lead-ann", "parked": first}
        assert await _post(w.web_port, task_id, approve) == (202, {"accepted": True, "task_id": task_id,
                                                                  "decision": "approve", "by": "lead-ann"})
        second = await eventually(lambda: _parked_at(w, task_id, "call_900"), timeout=60, what="refund(900) parked")
        assert len(services.executed("payment.refund")) == 1, "the approved refund(150) ran"

        status, body = await _post(w.web_port, task_id, approve)  # the retry after a 503
        assert status == 409 and "another parking" in body["error"] and str(second) in body["error"], body
        published = {"task_id": task_id, "decision": "approve", "by": "lead-ann", "via": "http", "parked": first,
                      "app_id": c.app_id, "agent": agent}  # what the first POST put on agent.approvals
        await produce(topics.APPROVALS, [(task_id.encode(), json.dumps(published).encode())])
        ignored = [e for e in await control_events(task_id, "approval.ignored") if e["event"] == "approval.ignored"]
        assert "another parking" in ignored[-1]["details"]["reason"], ignored
        env = {"WEB_PORT": str(w.web_port), "WEB_HOST": "127.0.0.1", "AGENTS_STREAM_READ_TOKEN": READ_TOKEN}
        retried = cli("approve", task_id, "--by", "lead-ann", "--parked", str(first), **env)
        assert retried.returncode == 1 and f"not parked at {first}" in retried.stderr, retried.stderr
        unnamed = cli("approve", task_id, "--by", "lead-ann", **env)
        assert unnamed.returncode == 2 and f"--parked {second}" in unnamed.stderr and "refund" in unnamed.stderr
        assert await _parked_at(w, task_id, "call_900") == second, "refund(900) still waits for its own decision"
        assert len(services.executed("payment.refund")) == 1, "refund(900) did not run"

        decided = cli("approve", task_id, "--by", "lead-bob", "--parked", str(second), **env)
        assert decided.returncode == 0, decided.stderr
        got = await results_for({task_id}, timeout=60)
        assert json.loads(got[task_id][0].value)["status"] == "succeeded"
        assert len(services.executed("payment.refund")) == 2, "each refund once, each after its own approval"
    print("\nretried approve: HTTP 409, event ignored, CLI exit 1; refund(900) ran only after its own decision")


async def test_one_app_ids_decision_does_not_decide_another_app_ids_task_of_the_same_id(cluster_factory, fake_llm):
    """Two app ids read the same task topic, so both hold task t and park it. Approving t over app A's worker runs
    A's t; B's t stays parked, and B says why (approval.ignored: the decision is app A's)."""
    agent = unique("gate")
    policy = (f'[agents.{agent}.approval]\nalways = true\n[[agents.{agent}.approval.levels]]\nname = "ops"\n'
              "timeout_s = 600\n")
    a = cluster_factory([agent], fake_llm.url, extra=policy, AGENTS_STREAM_API_TOKEN=TOKEN,
                        AGENTS_STREAM_START_FROM="earliest")
    b = cluster_factory([agent], fake_llm.url, extra=policy, AGENTS_STREAM_API_TOKEN=TOKEN,
                        AGENTS_STREAM_START_FROM="earliest")
    wa, wb = await a.started("a0"), await b.started("b0")  # their own data dirs
    t = task(agent, instruction="pay the invoice")
    await produce(topics.task_topic(agent), [encode(t)])
    waiting = {}
    for name, w in (("a", wa), ("b", wb)):
        waiting[name] = await eventually(lambda w=w: _listed(w, t["task_id"]), timeout=60, what=f"parked in {name}")
    status, body = await _post(wa.web_port, t["task_id"], {"decision": "approve", "by": "ann",
                                                            "parked": _parking(waiting["a"])})
    assert status == 202, body
    await eventually(lambda: _state_is(wa, t["task_id"], "succeeded"), timeout=60, what="A's task run")
    assert (await wb.get(f"/tasks/{t['task_id']}"))["state"] == "awaiting_approval", "B's task still waits"
    assert (waiting["a"]["app_id"], waiting["b"]["app_id"]) == (a.app_id, b.app_id), "/approvals names the app id"
    events = await control_events(t["task_id"], "approval.ignored")
    [ignored] = [e for e in events if e["event"] == "approval.ignored"]
    assert ignored["details"]["reason"] == (
        f"the decision is for the task of this id in app id {a.app_id}; this is app id {b.app_id}")


async def _listed(worker: Any, task_id: str) -> dict[str, Any] | None:
    return next((x for x in (await worker.get("/approvals"))["awaiting"] if x["task_id"] == task_id), None)


async def _state_is(worker: Any, task_id: str, state: str) -> bool:
    return (await worker.get(f"/tasks/{task_id}")).get("state") == state
