"""Human approval on the real broker: parked without holding the partition, escalation, decisions by link, HTTP,
CLI and event, exactly one run when approved, none when rejected."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any
from urllib.parse import unquote, urlsplit

import aiohttp
from aiohttp import web

from agents_stream.contract import topics

from .harness import (
    BOOTSTRAP,
    READ_TOKEN,
    ROOT,
    all_committed,
    encode,
    eventually,
    produce,
    read_topic,
    results_for,
    task,
    unique,
)

TOKEN = "t0ken-for-tests"


async def named(worker: Any, task_id: str) -> dict[str, Any]:
    """What a decision on the task names now (tables/approvals.binding_problem): app id, agent, parking."""
    view = await worker.get(f"/tasks/{task_id}")
    return {"app_id": view["app_id"], "agent": view["agent"], "parked": view["approval"]["parked"]}
LINK_SECRET = "link-secret-for-tests-of-32-characters-or-more"


class Hooks:
    """A webhook receiver (Slack-compatible JSON), recording every notification by path."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        self.url = ""

    async def __aenter__(self) -> Hooks:
        app = web.Application()

        async def hook(request: web.Request) -> web.Response:
            self.received.append((request.path, await request.json()))
            return web.Response(text="ok")

        app.router.add_post("/hook/{level}", hook)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._runner.cleanup()

    def for_task(self, task_id: str) -> list[tuple[str, dict[str, Any]]]:
        return [(p, b) for p, b in self.received if b.get("task_id") == task_id]


def approval_toml(agent: str, fake_url: str, hooks: str, lead_timeout: float, manager_timeout: float) -> str:
    return f"""
[providers.fake]
kind = "openai"
base_url = "{fake_url}/v1"
model = "fake-model"

[agents.{agent}]
providers = ["fake"]

[agents.{agent}.approval]
amount_field = "amount"
amount_above = 100
risk_at_least = "high"

[[agents.{agent}.approval.levels]]
name = "team-lead"
timeout_s = {lead_timeout}
webhook = "{hooks}/hook/lead"

[[agents.{agent}.approval.levels]]
name = "manager"
timeout_s = {manager_timeout}
webhook = "{hooks}/hook/manager"
"""


def controls_of(ids: set[str], until_event: str, timeout: float = 30) -> Any:
    return read_topic(
        topics.CONTROL, timeout=timeout,
        until=lambda s: any(json.loads(m.value)["event"] == until_event for m in s),
        keep=lambda m: (m.key is not None and m.key.decode() in ids
                        and json.loads(m.value)["event"].startswith("approval.")),
    )


def calls_for(fake: Any, task_id: str) -> int:
    return sum(1 for r in fake.requests if r.task_id == task_id or task_id in r.instruction)


async def test_approval_times_out_escalates_and_runs_once_when_approved_at_level_two(cluster_factory, fake_llm):
    """Level 1 lets its time run out → level 2 is notified; its signed link approves; the task runs exactly once.
    While parked it holds no partition: its offset is committed and a task behind it completes."""
    async with Hooks() as hooks:
        agent = unique("refunds")
        c = cluster_factory([agent], fake_llm.url, toml=approval_toml(agent, fake_llm.url, hooks.url, 3, 120),
                            AGENTS_STREAM_APPROVAL_SECRET=LINK_SECRET)
        w = await c.started()
        big = task(agent, instruction="refund order 7", context_data={"amount": 500})
        small = task(agent, instruction="refund order 8", context_data={"amount": 20})
        # the same partition: the small one sits behind the parked one
        await produce(topics.task_topic(agent), [encode(big), encode(small)], partition=0)

        got = await results_for({small["task_id"]}, timeout=60)
        assert json.loads(got[small["task_id"]][0].value)["status"] == "succeeded"
        await all_committed(c.app_id, topics.task_topic(agent), what="offsets committed past the parked task")
        assert calls_for(fake_llm, big["task_id"]) == 0
        waiting = (await w.get("/approvals"))["awaiting"]
        assert [a["task_id"] for a in waiting] == [big["task_id"]] and "amount 500 > 100" in waiting[0]["reason"]

        await eventually(lambda: len(hooks.for_task(big["task_id"])) >= 2, timeout=30, what="escalation to level 2")
        (lead_path, lead), (manager_path, manager) = hooks.for_task(big["task_id"])[:2]
        assert (lead_path, manager_path) == ("/hook/lead", "/hook/manager")
        assert "level 2, manager" in manager["text"]
        lead_approve = lead["blocks"][-1]["elements"][0]["url"]
        approve = manager["blocks"][-1]["elements"][0]["url"]
        local = lambda url: f"http://127.0.0.1:{w.web_port}{urlsplit(url).path}?{urlsplit(url).query}"  # noqa: E731
        async with aiohttp.ClientSession() as s:
            async with s.get(local(lead_approve)) as r:
                assert r.status == 403 and "expired" in await r.text(), "level 1's link expired with its level"
            async with s.get(local(approve)) as r:  # opening the link decides nothing: it asks to confirm
                assert r.status == 200 and "id='confirm'" in await r.text()
            assert calls_for(fake_llm, big["task_id"]) == 0
            fields = dict(p.split("=", 1) for p in urlsplit(approve).query.split("&"))
            async with s.post(local(approve).split("?")[0], data={k: unquote(v) for k, v in fields.items()}) as r:
                assert r.status == 202, await r.text()

        got = await results_for({big["task_id"]}, timeout=60)
        result = json.loads(got[big["task_id"]][0].value)
        assert result["status"] == "succeeded" and len(got[big["task_id"]]) == 1
        controls = await controls_of({big["task_id"]}, "approval.decided")
        events = [json.loads(m.value) for m in controls]
        assert [e["event"] for e in events] == ["approval.requested", "approval.escalated", "approval.decided"]
        assert events[-1]["details"] == {"decision": "approve", "by": "manager", "via": "link", "level": 1,
                                         "signed": True}
        await asyncio.sleep(3)  # any second run would show up here
        assert calls_for(fake_llm, big["task_id"]) == 1, "approved task ran exactly once"
        record = await w.get(f"/tasks/{big['task_id']}")
        assert record["state"] == "succeeded"
    print("\napproval: parked, level 1 timed out after 3 s, approved at level 2 by signed link; 1 provider call")


async def test_rejected_tasks_never_run_and_decisions_need_a_token_or_a_signature(cluster_factory, fake_llm):
    """Reject (CLI) → a failed result and no provider call; HTTP needs the bearer token; a parked task survives a
    SIGKILL and is approved by an event afterwards; the last level's timeout rejects; bad decisions are
    dead-lettered."""
    async with Hooks() as hooks:
        agent = unique("refunds")
        c = cluster_factory([agent], fake_llm.url, toml=approval_toml(agent, fake_llm.url, hooks.url, 120, 120),
                            AGENTS_STREAM_API_TOKEN=TOKEN)
        w = await c.started()
        rejected = task(agent, instruction="refund 1", context_data={"amount": 900})
        via_http = task(agent, instruction="refund 2", risk_level="critical")
        survivor = task(agent, instruction="refund 3", context_data={"amount": 101})
        await produce(topics.task_topic(agent), [encode(rejected), encode(via_http), encode(survivor)])
        await eventually(lambda: _len_awaiting(w, 3), timeout=30, what="three parked tasks")
        # The webhook is posted in the background after the task is parked: wait for it, don't race it.
        (_, hook), *_ = await eventually(lambda: hooks.for_task(rejected["task_id"]), timeout=15, what="the webhook")
        assert "Approve:" not in hook["text"], "no links without a secret"

        env = {**os.environ, "KAFKA_BROKER": f"kafka://{BOOTSTRAP}"}
        out = subprocess.run(
            [sys.executable, "-m", "agents_stream.ops.cli", "reject", rejected["task_id"], "--by", "carol",
             "--comment", "fraud", "--parked", str((await named(w, rejected["task_id"]))["parked"])],
            cwd=ROOT, env={**env, "WEB_PORT": str(w.web_port), "WEB_HOST": "127.0.0.1",
                           "AGENTS_STREAM_READ_TOKEN": READ_TOKEN}, capture_output=True, text=True, timeout=60,
        )
        assert out.returncode == 0, out.stderr
        got = await results_for({rejected["task_id"]}, timeout=30)
        result = json.loads(got[rejected["task_id"]][0].value)
        assert (result["status"], result["source"], result["error"]) == ("failed", "approval", "rejected by carol")

        url = f"http://127.0.0.1:{w.web_port}/approvals/{via_http['task_id']}"
        async with aiohttp.ClientSession() as s:
            async with s.post(url, json={"decision": "approve", "by": "mallory"}) as r:
                assert r.status == 401
            async with s.post(url, json={"decision": "approve", "by": "mallory"},
                              headers={"Authorization": "Bearer wrong"}) as r:
                assert r.status == 401
            async with s.post(url, json={"decision": "maybe", "by": "dave"},
                              headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                assert r.status == 400
            async with s.post(url, json={"decision": "approve", "by": "dave"},
                              headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                assert r.status == 400 and "parked is required" in (await r.json())["error"]
            parked = (await named(w, via_http["task_id"]))["parked"]
            async with s.post(url, json={"decision": "approve", "by": "dave", "parked": parked + 1},
                              headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                assert r.status == 409 and "another parking" in (await r.json())["error"]
            async with s.post(url, json={"decision": "approve", "by": "dave", "parked": parked},
                              headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                assert r.status == 202
        got = await results_for({via_http["task_id"]}, timeout=60)
        assert json.loads(got[via_http["task_id"]][0].value)["status"] == "succeeded"

        # The parked state is durable: a SIGKILLed worker's successor still has it, and applies a decision event.
        w.kill()
        w2 = await c.started("w-after-kill")
        await eventually(lambda: _len_awaiting(w2, 1), timeout=60, what="parked task recovered")
        decision = {"task_id": survivor["task_id"], "decision": "approve", "by": "erin",
                    **await named(w2, survivor["task_id"])}
        bad = {"task_id": survivor["task_id"], "decision": "approve"}  # no "by": dead-lettered
        await produce(topics.APPROVALS,
                      [(survivor["task_id"].encode(), json.dumps(bad).encode()), (None, json.dumps(decision).encode())])
        got = await results_for({survivor["task_id"]}, timeout=60)
        assert json.loads(got[survivor["task_id"]][0].value)["status"] == "succeeded"
        dead = await read_topic(topics.dlq_of(topics.APPROVALS), timeout=30, until=lambda s: len(s) >= 1,
                                keep=lambda m: m.key == survivor["task_id"].encode())
        headers = dict(dead[0].headers)
        assert headers["error_layer"] == b"schema" and b"by" in headers["error_reason"]

        await asyncio.sleep(2)
        assert calls_for(fake_llm, rejected["task_id"]) == 0, "a rejected task never reaches a provider"
        assert calls_for(fake_llm, via_http["task_id"]) == 1 and calls_for(fake_llm, survivor["task_id"]) == 1
        events = [json.loads(m.value) for m in await controls_of({rejected["task_id"]}, "approval.decided")]
        # no approval secret here: the CLI's decision is applied once and recorded as unsigned. Read again after the
        # SIGKILL (the group's commit can be one interval behind it), it is only ignored: the task was decided.
        decided = [e["details"] for e in events if e["event"] == "approval.decided"]
        assert decided == [{"decision": "reject", "by": "carol", "via": "cli", "level": 0, "comment": "fraud",
                            "signed": False}], events
        assert all(e["details"]["state"] == "rejected" for e in events if e["event"] == "approval.ignored"), events


async def test_last_level_timeout_rejects(cluster_factory, fake_llm):
    """No decision at any level: the task is rejected by "timeout" and never runs."""
    async with Hooks() as hooks:
        agent = unique("refunds")
        c = cluster_factory([agent], fake_llm.url, toml=approval_toml(agent, fake_llm.url, hooks.url, 1, 1))
        await c.started()
        t = task(agent, instruction="refund 9", risk_level="high")
        await produce(topics.task_topic(agent), [encode(t)])
        got = await results_for({t["task_id"]}, timeout=60)
        result = json.loads(got[t["task_id"]][0].value)
        assert result["status"] == "failed" and result["source"] == "approval" and "timeout" in result["error"]
        # each level told once; the order the two webhooks *arrive* in is not a promise (each is its own HTTP
        # request, and with 1 s levels the first can land after the second on a loaded machine)
        assert sorted(p for p, _ in hooks.for_task(t["task_id"])) == ["/hook/lead", "/hook/manager"]
        assert calls_for(fake_llm, t["task_id"]) == 0


async def _len_awaiting(worker: Any, n: int) -> bool:
    try:
        return len((await worker.get("/approvals"))["awaiting"]) == n
    except Exception:
        return False
