"""Human handoff on the real broker, in worker processes, with the fake LLM over HTTP: the agent hands the
conversation to a person, the person answers (marked human), the customer's next message reaches the operators'
inbox and not the model, the person hands it back with a note the model then reads — and a SIGKILL while a person
holds it, and again after the hand back, loses no message and answers none twice."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from agents_stream.client import Client
from agents_stream.contract import topics
from agents_stream.testing.fakellm import FakeLLM, ok
from agents_stream.testing.script import call, tool_calls

from .harness import eventually, read_topic, unique
from .test_agents import providers_toml

TOKEN = "handoff-write-token"
DESK = "tests.integration.handoff_agent:DESK"


def desk_toml(llm_url: str, agent: str, extra: str = "") -> str:
    """``agent`` as the handoff desk (tests/integration/handoff_agent.py) on the fake LLM's OpenAI provider; ``extra``
    goes on in the agent's table."""
    desk = f'[agents.{agent}]\nproviders = ["p_openai"]\nagent = "{DESK}"\n'
    return providers_toml(llm_url, ("openai",)) + desk + extra


#: the desk's answer when it hands the conversation over (``script_the_handoff``)
CONNECTING = "I am connecting you to a person."


def script_the_handoff(fake_llm: FakeLLM) -> None:
    """The model's next turns for a conversation: the handoff tool, then ``CONNECTING``."""
    fake_llm.enqueue(tool_calls(call("handoff", {"reason": "the customer asks for a person"})), ok(CONNECTING))


async def inbox_entry(worker: Any, cid: str) -> dict[str, Any] | None:
    """The conversation's entry in the operators' inbox (GET /handoffs), or None."""
    return next((e for e in (await _get(worker, "/handoffs"))["conversations"] if e["conversation_id"] == cid), None)


def _url(worker: Any) -> str:
    return f"http://127.0.0.1:{worker.web_port}"


async def _post(worker: Any, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.post(
        _url(worker) + path, json=body, headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=aiohttp.ClientTimeout(total=30),
    ) as resp:
        return resp.status, await resp.json()


async def _get(worker: Any, path: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(
        _url(worker) + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=aiohttp.ClientTimeout(total=30),
    ) as resp:
        return dict(await resp.json())


async def _replies(cid: str, count: int) -> list[dict[str, Any]]:
    found = await read_topic(topics.REPLIES, until=lambda seen: len(seen) >= count, timeout=60,
                             keep=lambda m: m.key is not None and m.key.decode() == cid)
    return [json.loads(m.value) for m in found]


async def _inbox_waits(worker: Any, cid: str, message_id: str) -> bool:
    body = await _get(worker, "/handoffs")
    return any(c["conversation_id"] == cid and [m["id"] for m in c["waiting"]] == [message_id]
               for c in body["conversations"])


async def test_handed_to_a_person_answered_as_human_and_handed_back_with_a_note_across_kills(
    cluster_factory, fake_llm,
):
    agent = unique("desk")
    c = cluster_factory([agent], None, toml=desk_toml(fake_llm.url, agent), AGENTS_STREAM_API_TOKEN=TOKEN)
    worker = await c.started("a")
    cid = unique("conv")
    script_the_handoff(fake_llm)
    async with Client(_url(worker), TOKEN) as client:
        first = await client.send(cid, agent, "I want to talk to a person")
        reply1 = await client.reply(cid, first.message_id, timeout=90)
        assert reply1["text"] == CONNECTING and not reply1.get("human")
        await eventually(lambda: _held(worker, cid), timeout=30,
                         what="the conversation in the operators' inbox")
        asked = len(fake_llm.requests)

        # bad input: a clear 4xx, no crashed worker
        assert (await _post(worker, f"/conversations/{unique('nope')}/reply", {"text": "x", "by": "ana"}))[0] == 404
        assert (await _post(worker, f"/conversations/{cid}/reply", {"text": "x" * 20_000, "by": "ana"}))[0] == 400

        # while a person holds it, the customer's message goes to the inbox, not the model; a kill changes nothing
        second = await client.send(cid, agent, "hello? is anyone there?")
        await eventually(lambda: _inbox_waits(worker, cid, second.message_id), timeout=30,
                         what="the message in the inbox")
    worker.kill()
    worker = await c.started("a")
    await eventually(lambda: _inbox_waits(worker, cid, second.message_id), timeout=60, what="the inbox after a kill")
    assert len(fake_llm.requests) == asked, "no model call while a person holds the conversation"

    # the person answers; a double click (same action id) is one reply
    for _ in range(2):
        status, _ = await _post(worker, f"/conversations/{cid}/reply",
                                {"text": "Hi, I am Ana from the desk.", "by": "ana", "action_id": "r-1"})
        assert status == 202
    async with Client(_url(worker), TOKEN) as client:
        reply2 = await client.reply(cid, second.message_id, timeout=60)
    assert reply2["text"] == "Hi, I am Ana from the desk." and reply2["human"] is True and reply2["operator"] == "ana"

    # hand back with a note, clicked twice, then a kill: the agent answers the next message once, reading the note
    statuses = [(await _post(worker, f"/conversations/{cid}/handback",
                              {"text": "Refund approved, order o-9.", "by": "ana", "action_id": "b-1"}))[0]
                for _ in range(2)]
    assert statuses[0] == 202 and statuses[1] in (202, 409), statuses  # 409 once the first was applied
    await eventually(lambda: _not_held(worker, cid), timeout=30, what="the conversation back with its agent")
    assert (await _post(worker, f"/conversations/{cid}/reply", {"text": "late", "by": "ana"}))[0] == 409
    worker.kill()
    worker = await c.started("a")
    fake_llm.enqueue(ok("Your refund for o-9 is on its way."))
    async with Client(_url(worker), TOKEN) as client:
        third = await client.send(cid, agent, "so what about my refund?")
        reply3 = await client.reply(cid, third.message_id, timeout=90)
        view = await client.conversation(cid)
    assert reply3["text"] == "Your refund for o-9 is on its way." and not reply3.get("human")
    assert len(fake_llm.requests) == asked + 1, "one model call after the hand back"
    said = json.dumps(fake_llm.requests[-1].body)
    assert "Refund approved, order o-9." in said and "Hi, I am Ana from the desk." in said
    replies = await _replies(cid, 3)
    by_message: dict[str, set[str]] = {}
    for r in replies:
        for i in r["message_ids"]:
            by_message.setdefault(i, set()).add(r["text"])
    assert by_message == {first.message_id: {reply1["text"]}, second.message_id: {reply2["text"]},
                          third.message_id: {reply3["text"]}}, by_message
    assert view is not None and [i["role"] for i in view["history"]] == [
        "customer", "agent", "customer", "operator", "note", "customer", "agent"]


async def _held(worker: Any, cid: str) -> bool:
    body = await _get(worker, f"/conversations/{cid}")
    return body.get("handoff") is not None


async def _not_held(worker: Any, cid: str) -> bool:
    body = await _get(worker, f"/conversations/{cid}")
    return body.get("handoff") is None and body.get("status") in ("idle", "answering")


HANDOFF_TEXT = "Our assistant is down: a person of the desk will answer you here."


async def test_a_provider_outage_past_handoff_after_s_hands_the_conversation_to_a_person_and_back(
    cluster_factory, fake_llm,
):
    """Every provider down past ``handoff_after_s``: the customer gets the "connecting you" reply (marked
    ``handoff: "outage"``) instead of silence, the conversation waits in GET /handoffs (source "outage"), a person
    answers and hands it back, the provider is back, and the agent answers the next message — each once."""
    agent = unique("desk")
    toml = desk_toml(fake_llm.url, agent,
                     f'handoff_after_s = 4\nhandoff_text = "{HANDOFF_TEXT}"\n[breaker]\nopen_timeout_s = 3\n')
    c = cluster_factory([agent], None, toml=toml, AGENTS_STREAM_API_TOKEN=TOKEN, AGENTS_STREAM_MAX_RETRIES="2")
    worker = await c.started("a")
    await fake_llm.set_mode(outage=True)
    cid = unique("conv")
    async with Client(_url(worker), TOKEN) as client:
        first = await client.send(cid, agent, "where is my order o-7?")
        reply1 = await client.reply(cid, first.message_id, timeout=120)
        assert reply1["text"] == HANDOFF_TEXT and reply1.get("handoff") == "outage" and not reply1.get("human")
        inbox = await _get(worker, "/handoffs")
        entry = next(e for e in inbox["conversations"] if e["conversation_id"] == cid)
        assert entry["source"] == "outage" and entry["held_by"] is None, entry
        page, script = await worker.get("/"), await worker.get("/console/inbox.js")  # the console's inbox panel
        assert 'id="inbox-table"' in page and 'api("GET", "/handoffs")' in script and "handback" in script
        asked = len(fake_llm.requests)

        second = await client.send(cid, agent, "hello?")
        await eventually(lambda: _inbox_waits(worker, cid, second.message_id), timeout=30,
                         what="the message in the inbox")
        status, _ = await _post(worker, f"/conversations/{cid}/reply",
                                {"text": "Ana here: o-7 left the warehouse today.", "by": "ana", "action_id": "o-r1"})
        assert status == 202
        reply2 = await client.reply(cid, second.message_id, timeout=60)
        assert reply2["human"] is True and reply2["operator"] == "ana"
        status, _ = await _post(worker, f"/conversations/{cid}/handback",
                                {"text": "Told them o-7 shipped today.", "by": "ana", "action_id": "o-b1"})
        assert status == 202
        await eventually(lambda: _not_held(worker, cid), timeout=30, what="the conversation back with its agent")
        assert len(fake_llm.requests) == asked, "no model call while a person holds the conversation"

        await fake_llm.set_mode(outage=False)
        await eventually(lambda: _provider_up(worker), timeout=60, what="the breaker closed again")
        third = await client.send(cid, agent, "when will it arrive?")
        reply3 = await client.reply(cid, third.message_id, timeout=120)
    # the model answered (unscripted, the fake echoes the prompt: a breaker probe may come at any time)
    assert "when will it arrive?" in reply3["text"] and not reply3.get("handoff") and not reply3.get("human")
    said = json.dumps([r.body for r in fake_llm.requests if "when will it arrive?" in json.dumps(r.body)])
    assert "Told them o-7 shipped today." in said
    replies = await _replies(cid, 3)
    assert [r["message_ids"] for r in replies] == [[first.message_id], [second.message_id], [third.message_id]]
    assert replies[0]["handoff"] == "outage"


async def _provider_up(worker: Any) -> bool:
    return (await worker.readyz()).get("providers_down") == []


async def test_a_kill_right_after_an_operators_reply_was_accepted_answers_the_customer_once(
    cluster_factory, fake_llm,
):
    """SIGKILL of the worker that owns the conversation right after a person's reply got its 202 (the action is on
    the broker; applying and sending it may or may not have happened): after the restart the customer has that
    reply, once, and the history holds one operator item for it."""
    agent = unique("desk")
    c = cluster_factory([agent], None, toml=desk_toml(fake_llm.url, agent), AGENTS_STREAM_API_TOKEN=TOKEN)
    worker = await c.started("a")
    cid = unique("conv")
    fake_llm.enqueue(tool_calls(call("handoff", {"reason": "asks for a person"})), ok("Connecting you to a person."))
    async with Client(_url(worker), TOKEN) as client:
        first = await client.send(cid, agent, "a person please")
        await client.reply(cid, first.message_id, timeout=90)
        await eventually(lambda: _held(worker, cid), timeout=30, what="the conversation in the operators' inbox")
        second = await client.send(cid, agent, "are you there?")
        await eventually(lambda: _inbox_waits(worker, cid, second.message_id), timeout=30,
                         what="the message in the inbox")
    status, _ = await _post(worker, f"/conversations/{cid}/reply",
                            {"text": "Yes, Ben here.", "by": "ben", "action_id": "k-r1"})
    assert status == 202
    worker.kill()  # at once: the ledger may not have applied it, or applied it and not sent the reply yet
    worker = await c.started("a")
    async with Client(_url(worker), TOKEN) as client:
        reply = await client.reply(cid, second.message_id, timeout=90)
        view = await client.conversation(cid)
    assert reply["text"] == "Yes, Ben here." and reply["human"] is True and reply["operator"] == "ben"
    replies = await _replies(cid, 2)
    texts = {r["text"] for r in replies if second.message_id in r["message_ids"]}
    print(f"\nreplies to the message after the kill: {sum(second.message_id in r['message_ids'] for r in replies)}")
    assert texts == {"Yes, Ben here."}, replies  # a copy sent again after the kill is the same reply, byte for byte
    assert view is not None and [i["role"] for i in view["history"]] == ["customer", "agent", "customer", "operator"]
    assert view["handoff"] is not None and view["handoff"]["held_by"] == "ben"
