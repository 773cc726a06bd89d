"""The wait for a person under escalation levels, on the real broker, in a worker process, over real HTTP (the
fake LLM scripts the agent's handoff; a real webhook receiver): a conversation nobody takes is escalated from level
to level — once each, though the worker is SIGKILLed while it waits — and past the last level it stays waiting in
the inbox; one an operator took is never escalated."""

from __future__ import annotations

import json
from typing import Any

from agents_stream.client import Client
from agents_stream.contract import topics

from .harness import eventually, read_topic, unique
from .test_approvals import Hooks
from .test_handoff import TOKEN, _post, _url, desk_toml, inbox_entry, script_the_handoff


async def _handed_over(worker: Any, client: Client, cid: str, agent: str) -> None:
    first = await client.send(cid, agent, "I want to talk to a person")
    await client.reply(cid, first.message_id, timeout=90)
    await eventually(lambda: inbox_entry(worker, cid), timeout=30, what="the conversation in the operators' inbox")


async def test_a_conversation_nobody_takes_escalates_once_per_level_across_a_kill_and_stays_waiting(
    cluster_factory, fake_llm,
):
    agent = unique("desk")
    async with Hooks() as hooks:
        toml = desk_toml(fake_llm.url, agent)
        for name in ("oncall", "lead"):
            toml += (f'[[agents.{agent}.handoff_levels]]\nname = "desk-{name}"\ntimeout_s = 4\n'
                     f'webhook = "{hooks.url}/hook/{name}"\n')
        c = cluster_factory([agent], None, toml=toml, AGENTS_STREAM_API_TOKEN=TOKEN)
        worker = await c.started("a")
        taken, cid = unique("conv"), unique("conv")
        for _ in range(2):
            script_the_handoff(fake_llm)
        async with Client(_url(worker), TOKEN) as client:
            await _handed_over(worker, client, taken, agent)
            assert (await _post(worker, f"/conversations/{taken}/handoff", {"by": "ben"}))[0] == 202
            await _handed_over(worker, client, cid, agent)
        entry = await inbox_entry(worker, cid)
        assert entry is not None and entry["held_by"] is None and entry["level"] == 1, entry
        assert entry["level_name"] == "desk-oncall" and entry["due"] > entry["held_at"] and not entry["escalations"]
        worker.kill()  # while it waits at level 1, before its time runs out: the escalation is the next owner's
        worker = await c.started("a")

        async def unanswered() -> dict[str, Any] | None:
            found = await inbox_entry(worker, cid)
            return found if found is not None and found["unanswered"] else None

        entry = await eventually(unanswered, timeout=60, what="every level's time run out")
        # past the last level the customer still waits for a person: listed, not dropped, no more timers
        assert entry["held_by"] is None and entry["level"] == 2 and entry["due"] is None, entry
        assert [(e["from"], e["to"]) for e in entry["escalations"]] == [(0, 1), (1, None)], entry
        claimed = await inbox_entry(worker, taken)
        assert claimed is not None and claimed["held_by"] == "ben" and claimed["level"] == 1, claimed
        assert claimed["due"] is None and not claimed["escalations"], claimed

        controls = await read_topic(
            topics.CONTROL, timeout=30, keep=lambda m: m.key is not None and m.key.decode() in (cid, taken),
            until=lambda seen: any(json.loads(m.value)["event"] == "handoff.unanswered" for m in seen))
        told = [(m.key.decode(), json.loads(m.value)["event"]) for m in controls]
        assert told.count((cid, "handoff.escalated")) == 1, told  # once, though a worker was killed meanwhile
        assert told.count((cid, "handoff.unanswered")) == 1, told
        assert (taken, "handoff.escalated") not in told and (cid, "handoff.waiting") in told, told
        events = await read_topic(
            topics.CONVERSATION_EVENTS, timeout=30, keep=lambda m: m.key is not None and m.key.decode() == cid,
            until=lambda seen: sum(json.loads(m.value)["kind"] == "handoff_escalated" for m in seen) >= 2)
        assert sum(json.loads(m.value)["kind"] == "handoff_escalated" for m in events) == 2

        # each level's webhook was told (the notice after the last level says it is overdue)
        def heard() -> list[tuple[str, bool]] | None:
            got = sorted((p, b["overdue"]) for p, b in hooks.received if b.get("conversation_id") == cid)
            return got if {("/hook/lead", False), ("/hook/lead", True)} <= set(got) else None

        got = await eventually(heard, timeout=15, what="the levels' webhooks")
        assert ("/hook/oncall", False) in got and "desk-lead" in next(
            b["text"] for p, b in hooks.received if p == "/hook/lead" and b.get("conversation_id") == cid)

        # an operator takes it at last: held, the escalations it went through still shown
        assert (await _post(worker, f"/conversations/{cid}/handoff", {"by": "ana"}))[0] == 202

        async def held() -> dict[str, Any] | None:
            found = await inbox_entry(worker, cid)
            return found if found is not None and found["held_by"] == "ana" else None

        entry = await eventually(held, timeout=30, what="the conversation taken by ana")
        assert entry["due"] is None and len(entry["escalations"]) == 2
