"""The console's operators' inbox driven in a real headless Chromium against a real worker and broker: an operator
sees a conversation waiting for a person (its escalation level shown), takes it, types a reply and sends it, and
hands it back with a note — and the service (not just the page) has each of them once."""

from __future__ import annotations

import asyncio
import json

from agents_stream.client import Client
from agents_stream.contract import topics

from .harness import eventually, read_topic, unique
from .test_console import Page, chromium
from .test_handoff import TOKEN, _get, _url, desk_toml, inbox_entry, script_the_handoff


async def test_an_operator_takes_replies_and_hands_back_in_the_console_inbox(cluster_factory, fake_llm, tmp_path):
    agent = unique("desk")
    toml = desk_toml(fake_llm.url, agent, f'[[agents.{agent}.handoff_levels]]\nname = "desk-oncall"\ntimeout_s = 600\n')
    c = cluster_factory([agent], None, toml=toml, AGENTS_STREAM_API_TOKEN=TOKEN)
    worker = await c.started("a")
    cid = unique("conv")
    script_the_handoff(fake_llm)
    async with Client(_url(worker), TOKEN) as client:
        first = await client.send(cid, agent, "I want to talk to a person")
        await client.reply(cid, first.message_id, timeout=90)
        second = await client.send(cid, agent, "my parcel p-42 never came")

        async def waits() -> bool:
            entry = await inbox_entry(worker, cid)
            return entry is not None and [m["id"] for m in entry["waiting"]] == [second.message_id]

        await eventually(waits, timeout=30, what="the customer's message in the inbox")
        asked = len(fake_llm.requests)

        driver = await asyncio.to_thread(chromium, tmp_path / "chromium-profile")
        try:
            page = Page(driver)
            row = f'tr[data-inbox-conversation="{cid}"]'
            await page.run(driver.get, f"http://127.0.0.1:{worker.web_port}/")
            await page.type("#token", TOKEN)
            await page.click("#token-save")
            await page.type("#operator", "ana")
            await page.wait("the waiting conversation in the inbox", lambda d: d.execute_script(
                "const r = document.querySelector(arguments[0]); return !!r && "
                "r.textContent.includes('my parcel p-42 never came')", row))
            assert "waiting for a person" in await page.text(f"{row} td.held")
            assert (await page.text(f"{row} td.level")).startswith("1 · desk-oncall · due ")
            await page.js("document.getElementById('inbox').scrollIntoView()")

            await page.click(f"{row} button.take")

            async def taken() -> bool:
                entry = await inbox_entry(worker, cid)
                return entry is not None and entry["held_by"] == "ana"

            await eventually(taken, timeout=30, what="the conversation taken by ana at the service")
            taken_entry = await inbox_entry(worker, cid)
            assert taken_entry is not None and taken_entry["due"] is None, "taking it stops its timers"
            await page.wait("the row held by ana", lambda d: d.execute_script(
                "const r = document.querySelector(arguments[0]); return !!r && "
                "r.querySelector('td.held').textContent.startsWith('ana') && r.querySelector('button.take').hidden",
                row), timeout=15)

            await page.type(f"{row} input.comment", "Ana here: p-42 is re-sent today.")
            await page.click(f"{row} button.approve")
            reply = await client.reply(cid, second.message_id, timeout=60)
            assert reply["text"] == "Ana here: p-42 is re-sent today." and reply["human"] is True
            assert reply["operator"] == "ana"

            await page.wait("the reply accepted on the row", lambda d: d.execute_script(
                "const n = document.querySelector(arguments[0]); return !!n && n.classList.contains('ok')",
                f"{row} .row-status"))
            await page.type(f"{row} input.comment", "Re-sent p-42; tracking follows by mail.")
            await page.click(f"{row} button.handback")

            async def back() -> bool:
                view = await _get(worker, f"/conversations/{cid}")
                return view.get("handoff") is None and view.get("status") == "idle"

            await eventually(back, timeout=30, what="the conversation back with its agent")
            await page.wait("the row gone from the inbox", lambda d: d.execute_script(
                "return !document.querySelector(arguments[0])", row), timeout=15)
            assert await page.errors() == [], "no script errors or CSP violations in the console"
        finally:
            await asyncio.to_thread(driver.quit)

        view = await client.conversation(cid)
    assert view is not None
    assert [(i["role"], i["text"]) for i in view["history"][2:]] == [
        ("customer", "my parcel p-42 never came"), ("operator", "Ana here: p-42 is re-sent today."),
        ("note", "Re-sent p-42; tracking follows by mail.")], view["history"]
    replies = await read_topic(topics.REPLIES, timeout=30, until=lambda seen: len(seen) >= 2,
                               keep=lambda m: m.key is not None and m.key.decode() == cid)
    human = [json.loads(m.value) for m in replies if json.loads(m.value).get("human")]
    assert [(r["message_ids"], r["operator"]) for r in human] == [([second.message_id], "ana")], human
    assert len(fake_llm.requests) == asked, "no model call while a person held the conversation"
