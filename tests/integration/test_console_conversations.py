"""The console's conversation view, driven in a real headless Chromium against a real worker running the support
agent (the fake LLM, the example services over HTTP, the broker): a conversation's message, its reply and its
round's tool calls shown; the worker killed and back, the view resumes its event stream after the last event it
showed, and the next message, its tool call and its reply arrive live on it."""

from __future__ import annotations

import asyncio
from typing import Any

from agents_stream.client import Client
from agents_stream.examples.services import FakeServices
from agents_stream.testing.fakellm import call, ok, tool_calls

from .harness import unique
from .test_agents import support_script
from .test_console import HOSTILE, SCREENSHOTS, Page, chromium
from .test_conversations import TOKEN, start_support


def _thread(d: Any) -> dict[str, Any]:
    """What the view shows, in its order: messages by id, replies by round, tool calls by round, the live badge."""
    shown = d.execute_script("""
        const text = (n, css) => { const x = n.querySelector(css); return x ? x.textContent : null; };
        const view = document.getElementById('conv-view');
        return {
          shown: !view.hidden, live: document.getElementById('conv-live').textContent,
          status: document.getElementById('conv-status').textContent, last: view.dataset.lastEventId,
          messages: [...document.querySelectorAll('#conv-thread li.customer')]
            .map(li => [li.dataset.messageId, text(li, '.text')]),
          replies: [...document.querySelectorAll('#conv-thread li.agent')]
            .map(li => [li.dataset.round, text(li, '.text')]),
          calls: [...document.querySelectorAll('#conv-thread li.round')]
            .map(li => [li.dataset.round, [...li.querySelectorAll('li.call')]
              .map(c => [text(c, '.name'), text(c, '.args'), c.dataset.status])]),
        };""")
    # Lists of pairs from the page: the driver does not keep an object's key order.
    return {**shown, **{k: dict(shown[k]) for k in ("messages", "replies", "calls")}}


async def test_the_console_shows_a_conversation_its_tool_calls_and_the_next_message_live(
    cluster_factory, fake_llm, tmp_path,
):
    async with FakeServices() as services:
        c, worker, (agent,) = await start_support(cluster_factory, fake_llm, services)
        url = f"http://127.0.0.1:{worker.web_port}"
        cid, order = unique("conv"), unique("o")
        fake_llm.enqueue(*support_script(order))
        text = f"{HOSTILE} {order}"  # untrusted text: shown as text, never markup
        async with Client(url, TOKEN) as client:
            first = await client.send(cid, agent, text, context_data={"order_id": order}, user="ana")
            reply1 = await client.reply(cid, first.message_id, timeout=90)
            driver = await asyncio.to_thread(chromium, tmp_path / "chromium-profile")
            try:
                page = Page(driver)
                await page.run(driver.get, url + "/")
                await page.type("#token", TOKEN)
                await page.click("#token-save")
                # Its round is among the recent tasks: the conversation is offered, and opens from there.
                button = f'#conv-recent button[data-conversation="{cid}"]'
                await page.wait("the conversation among the recent ones", lambda d: d.execute_script(
                    "return !!document.querySelector(arguments[0])", button))
                await page.click(button)
                await page.wait("the message, its reply and the round's four tool calls", lambda d: (
                    (t := _thread(d))["shown"] and first.message_id in t["messages"] and "1" in t["replies"]
                    and len(t["calls"].get("1", [])) == 4 and all(c[2] == "ok" for c in t["calls"]["1"])
                    and all(c[1] for c in t["calls"]["1"])), timeout=30)
                before = await page.run(_thread, driver)
                assert await page.js("return document.querySelectorAll('img').length") == 0
                assert await page.js("return document.title") == "agents-stream console"
                assert await page.errors() == [], "no script errors or CSP violations in the console"

                # The worker serving the stream is killed and comes back at its address: the view reconnects
                # with Last-Event-ID, the last event it showed.
                await page.js("const real = window.fetch; window.resumedAfter = []; window.fetch = (url, init) => {"
                              " if (String(url).endsWith('/events')) window.resumedAfter.push("
                              "   (init.headers || {})['Last-Event-ID'] ?? null);"
                              " return real(url, init); };")
                worker.kill()
                await page.wait("the view reconnecting", lambda d: _thread(d)["live"] == "reconnecting", timeout=30)
                worker = await c.started("a", WEB_PORT=str(worker.web_port))
                await page.wait("the stream resumed", lambda d: _thread(d)["live"] == "live", timeout=60)
                resumed = await page.js("return window.resumedAfter")

                # The next message, its tool call and its reply arrive on the event stream (the view never polls).
                fake_llm.enqueue(tool_calls(call("lookup_order", {"order_id": order})),
                                 ok("Only that order was lost; the other one arrives tomorrow."))
                follow = await client.send(cid, agent, "and the other order too?")
                await page.wait("the next round shown live", lambda d: (
                    (t := _thread(d))["messages"].get(follow.message_id) == "and the other order too?"
                    and t["replies"].get("2", "").startswith("Only that order")
                    and [c[0] for c in t["calls"].get("2", [])] == ["lookup_order"]), timeout=60)
                after = await page.run(_thread, driver)
                await page.js("document.getElementById('conversations').scrollIntoView()")
                await page.screenshot(SCREENSHOTS / "console-conversation.png")
                # While the worker was down (and starting: /readyz 503) requests failed; nothing else went wrong.
                errors = [e for e in await page.errors() if "Failed to load resource" not in e]
                assert errors == [], "no script errors or CSP violations in the console"
            finally:
                await asyncio.to_thread(driver.quit)

    assert before["messages"][first.message_id] == text and before["replies"]["1"] == reply1["text"]
    names = [c[0] for c in before["calls"]["1"]]
    assert names == ["lookup_order", "create_label", "refund", "notify_customer"], before["calls"]
    assert f'"order_id":"{order}"' in before["calls"]["1"][2][1] and '"amount":42.5' in before["calls"]["1"][2][1]
    assert before["status"] == "idle" and before["live"] == "live", before
    assert resumed and set(resumed) == {before["last"]}, ("every reconnect resumed after the last event", resumed)
    assert after["live"] == "live" and int(after["last"]) > int(before["last"]), (before["last"], after["last"])
    assert after["messages"][first.message_id] == text and after["replies"]["1"] == reply1["text"]
    assert after["calls"]["1"] == before["calls"]["1"], "the resumed stream showed nothing twice"
    assert after["calls"]["2"][0][2] == "ok" and after["status"] == "idle", after


async def test_a_long_conversation_shows_its_last_page_and_pages_back_on_request(cluster_factory, tmp_path):
    """26 messages and replies (52 history items, a page holds 50): the view shows the last page, and the event
    stream, which starts at the conversation's first event, does not draw the round before it; "Earlier history"
    does."""
    agent = unique("plain")
    c = cluster_factory([agent], None, AGENTS_STREAM_API_TOKEN=TOKEN)
    worker = await c.started("a")
    url = f"http://127.0.0.1:{worker.web_port}"
    cid = unique("conv")
    async with Client(url, TOKEN) as client:
        sent = []
        for i in range(26):
            sent.append(await client.send(cid, agent, f"message {i}"))
            await client.reply(cid, sent[-1].message_id, timeout=60)
    driver = await asyncio.to_thread(chromium, tmp_path / "chromium-profile")
    try:
        page = Page(driver)
        await page.run(driver.get, url + "/")
        await page.type("#token", TOKEN)
        await page.click("#token-save")
        await page.type("#conv-id", cid)
        await page.click("#conv-form button[type=submit]")
        await page.wait("the last page, followed live", lambda d: (
            (t := _thread(d))["live"] == "live" and len(t["replies"]) == 25 and t["last"] != ""), timeout=30)
        await asyncio.sleep(2)  # the stream's replay of the first round would be drawn by now
        last_page = await page.run(_thread, driver)
        older = await page.js("return !document.getElementById('conv-older').hidden")
        await page.click("#conv-older")
        await page.wait("the first round", lambda d: "1" in _thread(d)["replies"], timeout=30)
        whole = await page.run(_thread, driver)
        assert await page.js("return document.getElementById('conv-older').hidden") is True
        assert await page.errors() == []
    finally:
        await asyncio.to_thread(driver.quit)
    assert older is True
    assert list(last_page["messages"]) == [s.message_id for s in sent[1:]], "round 1 is not on the last page"
    assert sorted(map(int, last_page["replies"])) == list(range(2, 27))
    assert list(whole["messages"]) == [s.message_id for s in sent] and len(whole["replies"]) == 26
