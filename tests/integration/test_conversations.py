"""Conversations on the real broker: the support agent answers a customer over HTTP (agents_stream.client), in
worker processes, with the fake LLM and the example services over HTTP — one reply per message, a follow-up that
only makes sense with the history, a double click, and a SIGKILL between the refund and the reply."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import select
import subprocess
import sys
import time
from typing import Any, NamedTuple
from urllib.parse import quote

import aiohttp
import pytest

from agents_stream.client import Client, ClientError, Event
from agents_stream.contract import topics
from agents_stream.contract.conversation_messages import round_task_id
from agents_stream.examples.services import FakeServices
from agents_stream.testing.fakellm import hang, ok

from .harness import PARTITIONS, eventually, read_topic, unique
from .test_agents import SUPPORT, agent_toml, providers_toml, support_script, turn_of, turns_asked

TOKEN = "conversations-write-token"


class Support(NamedTuple):
    cluster: Any
    worker: Any
    agents: list[str]


async def start_support(cluster_factory: Any, fake_llm: Any, services: Any, *double_texting: str | None) -> Support:
    """One worker (named "a") running a support agent per ``double_texting`` mode given (None: the agent's default;
    none given: one agent) against the fake LLM's OpenAI API and the example ``services``, with the write token."""
    modes = double_texting or (None,)
    agents = [unique("support") for _ in modes]
    toml = providers_toml(fake_llm.url, ("openai",))
    for agent, mode in zip(agents, modes, strict=True):
        section = agent_toml(agent, ["p_openai"])
        toml += section if mode is None else section.replace(
            f'agent = "{SUPPORT}"\n', f'agent = "{SUPPORT}"\ndouble_texting = "{mode}"\n')
    c = cluster_factory(agents, None, toml=toml, AGENTS_STREAM_REFUND_SERVICES=services.url,
                        AGENTS_STREAM_API_TOKEN=TOKEN)
    return Support(c, await c.started("a"), agents)


def _worker_url(worker: Any) -> str:
    return f"http://127.0.0.1:{worker.web_port}"


async def _replies(cid: str, messages: int, timeout: float = 30) -> list[dict[str, Any]]:
    """The conversation's records on agent.replies, once ``messages`` distinct messages have a reply."""
    def answered(seen: list[Any]) -> bool:
        return len({i for m in seen for i in json.loads(m.value)["message_ids"]}) >= messages

    found = await read_topic(topics.REPLIES, until=answered, timeout=timeout,
                             keep=lambda m: m.key is not None and m.key.decode() == cid)
    return [json.loads(m.value) for m in found]


def _one_distinct_reply_per_message(replies: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    by_message: dict[str, set[str]] = {}
    for r in replies:
        for i in r["message_ids"]:
            by_message.setdefault(i, set()).add(json.dumps(r, sort_keys=True))
    assert all(len(v) == 1 for v in by_message.values()), f"a message with two different replies: {by_message}"
    return {i: json.loads(next(iter(v))) for i, v in by_message.items()}


def _said(request: Any) -> str:
    """Every text of a model request (OpenAI wire format), in order."""
    return "\n".join(str(m.get("content") or "") for m in (request.body or {}).get("messages", []))


async def test_a_customer_conversation_one_reply_per_message_and_a_follow_up_that_needs_the_history(
    cluster_factory, fake_llm,
):
    async with FakeServices() as services:
        _, worker, (agent,) = await start_support(cluster_factory, fake_llm, services)
        cid, order = unique("conv"), unique("o")
        fake_llm.enqueue(*support_script(order))
        text = f"My package {order} never came, give me my money back"
        async with Client(_worker_url(worker), TOKEN) as client:
            first = await client.send(cid, agent, text, context_data={"order_id": order}, user="ana")
            # a double click: the same message again while its round acts
            await client.send(cid, agent, text, message_id=first.message_id, context_data={"order_id": order},
                              user="ana")
            reply1 = await client.reply(cid, first.message_id, timeout=90)
            fake_llm.enqueue(ok("Only that order was lost; the other one arrives tomorrow."))
            follow = await client.send(cid, agent, "and the other order too?")
            reply2 = await client.reply(cid, follow.message_id, timeout=90)
            view = await client.conversation(cid)
        assert reply1["text"] == "Refunded 42.50 and sent a return label." and reply1["status"] == "succeeded"
        assert reply2["text"].startswith("Only that order") and reply2["round"] == 2
        second_round = [r for r in fake_llm.requests if r.task_id == round_task_id(cid, 2, PARTITIONS, first.offset)]
        assert second_round, "the follow-up was answered by round 2"
        said = _said(second_round[0])
        assert said.index(text) < said.index("Refunded 42.50") < said.index("and the other order too?"), said
        assert len(services.executed("payment.refund")) == 1, "the double click refunded nothing twice"
        replies = _one_distinct_reply_per_message(await _replies(cid, 2))
        assert set(replies) == {first.message_id, follow.message_id}
        assert view is not None and view["status"] == "idle" and view["rounds"] == 2
        asked = [i for i in view["history"] if i["role"] == "customer"]
        assert [i["id"] for i in asked] == [first.message_id, follow.message_id] and asked[0]["user"] == "ana"
        assert [i["text"] for i in view["history"] if i["role"] == "agent"] == [reply1["text"], reply2["text"]]
        assert view["messages"] == 2 and view["items"] == 4 and view["waiting"] == []


async def test_a_kill_between_the_refund_and_the_reply_leaves_one_refund_and_one_reply(cluster_factory, fake_llm):
    """SIGKILL after the refund was journaled, while the model turn that writes the reply is in flight; the client
    sends the same message again after the restart (it never saw an answer): one refund, one reply. An event
    stream cut by the kill resumes from its last event on the restarted worker and sees every event once."""
    async with FakeServices() as services:
        c, worker, (agent,) = await start_support(cluster_factory, fake_llm, services)
        cid, order = unique("conv"), unique("o")
        script = support_script(order)
        fake_llm.enqueue(script[0], script[1], hang(60))
        text = f"My package {order} never came, refund me"
        seen: list[Event] = []
        watching = asyncio.create_task(_watch(_worker_url(worker), cid, seen, after=None))
        async with Client(_worker_url(worker), TOKEN) as client:
            sent = await client.send(cid, agent, text, context_data={"order_id": order})
        round1 = round_task_id(cid, 1, PARTITIONS, sent.offset)
        await eventually(lambda: 2 in turns_asked(fake_llm, round1), timeout=60, what="the turn after the refund")
        assert services.executed("payment.refund"), "the refund took effect before the kill"
        await eventually(lambda: _journaled(worker, round1, calls=3), timeout=10, what="the refund in the journal")
        await eventually(lambda: any(e.data["data"].get("name") == "refund" for e in seen), timeout=10,
                         what="the refund's result in the event stream")
        worker.kill()
        with pytest.raises(ClientError):  # the stream ends with the worker that served it
            await asyncio.wait_for(watching, 30)
        fake_llm.enqueue(*script[2:])
        worker = await c.started("a")
        resumed = asyncio.create_task(_watch(_worker_url(worker), cid, seen, after=seen[-1].offset))
        async with Client(_worker_url(worker), TOKEN) as client:
            await client.send(cid, agent, text, message_id=sent.message_id, context_data={"order_id": order})
            reply = await client.reply(cid, sent.message_id, timeout=90)
        assert reply["text"] == "Refunded 42.50 and sent a return label."
        refunds = [x for x in services.calls if x.operation == "payment.refund" and x.key.startswith(round1)]
        assert len(refunds) == 1 and len(services.executed("payment.refund")) == 1
        assert turns_asked(fake_llm, round1) == [0, 1, 2, 2, 3], "only the turn in flight at the kill is asked again"
        replies = await _replies(cid, 1)
        assert set(_one_distinct_reply_per_message(replies)) == {sent.message_id}
        await asyncio.wait_for(resumed, 30)
        ids = [e.data["id"] for e in seen]
        assert len(ids) == len(set(ids)), f"an event seen twice: {ids}"
        assert [e.offset for e in seen] == sorted(e.offset for e in seen)
        tools = [e.data["data"]["name"] for e in seen if e.kind == "tool_result"]
        assert sorted(tools) == ["create_label", "lookup_order", "notify_customer", "refund"], ids
        assert [e.kind for e in seen][:2] == ["message", "round_started"] and seen[-1].kind == "reply", ids
        assert [e.data["data"]["attempt"] for e in seen if e.kind == "dispatched"] == [1, 2], ids


async def _watch(url: str, cid: str, seen: list[Event], *, after: int | None) -> None:
    """Follow the conversation's events into ``seen`` until its reply."""
    async with Client(url, TOKEN) as client:
        async for event in client.events(cid, after=after, timeout=120):
            seen.append(event)
            if event.kind == "reply":
                return


async def _journaled(worker: Any, task_id: str, *, calls: int) -> bool:
    transcript = ((await worker.get(f"/tasks/{quote(task_id, safe='')}")).get("progress") or {}).get("transcript")
    return len((transcript or {}).get("tool_calls", [])) >= calls


async def test_a_message_during_a_tool_call_waits_for_the_next_round_or_is_rejected(cluster_factory, fake_llm):
    """The second message lands while the first round's refund is in flight. `enqueue`: the next round answers it,
    after the first reply, which it sees; `reject`: answered at once with a refusal while the round goes on."""
    async with FakeServices() as services:
        _, worker, (queued, rejecting) = await start_support(cluster_factory, fake_llm, services, None, "reject")
        async with Client(_worker_url(worker), TOKEN) as client:
            for agent in (queued, rejecting):
                cid, order = unique("conv"), unique("o")
                fake_llm.enqueue(*support_script(order))
                services.delay("payment.refund", 30)
                first = await client.send(cid, agent, f"My package {order} never came",
                                          context_data={"order_id": order})
                round1 = round_task_id(cid, 1, PARTITIONS, first.offset)
                await eventually(lambda r=round1: [k for k in services.executed("payment.refund") if k.startswith(r)],
                                 timeout=60, what="the refund in flight")
                if agent == queued:
                    fake_llm.enqueue(ok("Your address is changed too."))
                second = await client.send(cid, agent, "also, please change my address")
                if agent == rejecting:
                    refused = await client.reply(cid, second.message_id, timeout=30)
                    assert refused["status"] == "rejected" and refused["round"] == 1
                    view = await client.conversation(cid)
                    assert view is not None and view["status"] == "answering", "refused while round 1 still acts"
                services.delay("payment.refund", 0)
                reply1 = await client.reply(cid, first.message_id, timeout=60)
                assert reply1["text"] == "Refunded 42.50 and sent a return label." and reply1["message_ids"] == [
                    first.message_id]
                if agent == queued:
                    reply2 = await client.reply(cid, second.message_id, timeout=60)
                    assert reply2["round"] == 2 and reply2["text"] == "Your address is changed too."
                    round2 = round_task_id(cid, 2, PARTITIONS, first.offset)
                    (asked,) = [r for r in fake_llm.requests if r.task_id == round2]
                    said = _said(asked)
                    assert said.index("Refunded 42.50") < said.index("please change my address"), said
                view = await client.conversation(cid)
                assert view is not None and view["status"] == "idle"
                assert view["rounds"] == (2 if agent == queued else 1)
                assert len([k for k in services.executed("payment.refund") if k.startswith(round1)]) == 1


async def test_the_chat_command_in_a_terminal(cluster_factory, fake_llm):
    """`agents-stream chat` on a real pty: a message typed, the agent's tool calls and its reply printed as they
    come, a follow-up in the same conversation, Ctrl-D ends it with exit code 0."""
    async with FakeServices() as services:
        _, worker, (agent,) = await start_support(cluster_factory, fake_llm, services)
        order = unique("o")
        fake_llm.enqueue(*support_script(order), ok("You are welcome.\nAnything else?"))
        env = {**os.environ, "AGENTS_STREAM_PUBLIC_URL": _worker_url(worker), "AGENTS_STREAM_API_TOKEN": TOKEN}
        with Terminal([sys.executable, "-m", "agents_stream.ops.cli", "chat", agent, "--conversation",
                       unique("conv")], env) as term:
            await term.expect("you> ")
            term.type(f"my package {order} never came, refund me\n")
            screen = await term.expect("Refunded 42.50 and sent a return label.")
            assert "refund(" in screen and "✓ refund" in screen and "✓ notify_customer" in screen, screen
            await term.expect("you> ")
            term.type("thanks!\n")
            screen = await term.expect("Anything else?")
            assert "agent> You are welcome.\nAnything else?" in screen.replace("\r\n", "\n"), screen
            await term.expect("you> ")
            term.type("\x04")  # Ctrl-D: the end of input
            assert await term.exit_code() == 0
        assert len(services.executed("payment.refund")) == 1


class Terminal:
    """A process on a real pseudo-terminal: what it printed is read as it comes."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv, self.env = argv, env
        self.screen = ""

    def __enter__(self) -> Terminal:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(self.argv, stdin=slave, stdout=slave, stderr=slave, env=self.env,
                                     close_fds=True)
        os.close(slave)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self.master)

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    async def expect(self, text: str, timeout: float = 90.0) -> str:
        """Everything printed since the last expect, once it holds ``text``."""
        deadline = time.monotonic() + timeout
        while text not in self.screen:
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not printed within {timeout}s; the terminal shows:\n{self.screen}")
            ready, _, _ = await asyncio.to_thread(select.select, [self.master], [], [], 0.5)
            if ready:
                try:
                    self.screen += os.read(self.master, 65536).decode("utf-8", "replace")
                except OSError:  # the process ended and closed its side
                    await asyncio.sleep(0.2)
        head, _, tail = self.screen.partition(text)
        self.screen = tail
        return head + text

    async def exit_code(self, timeout: float = 30.0) -> int:
        return await asyncio.to_thread(self.proc.wait, timeout)


async def test_a_deleted_conversation_leaves_a_tombstone_for_every_key(cluster_factory, fake_llm):
    """`agents-stream conversations delete`: every key of the conversation in its table's changelog, and each of
    its rounds' task records, ends with a tombstone; the conversation is gone from the view."""
    agent = unique("plain")
    c = cluster_factory([agent], fake_llm.url, AGENTS_STREAM_API_TOKEN=TOKEN)
    worker = await c.started("a")
    cid = unique("conv")
    fake_llm.enqueue(ok("Hello."), ok("Still here."))
    async with Client(_worker_url(worker), TOKEN) as client:
        first = await client.send(cid, agent, "hello")
        rounds = [(await client.reply(cid, first.message_id, timeout=60))["task_id"]]
        second = await client.send(cid, agent, "are you there?")
        rounds.append((await client.reply(cid, second.message_id, timeout=60))["task_id"])
        env = {**os.environ, "AGENTS_STREAM_PUBLIC_URL": _worker_url(worker), "AGENTS_STREAM_API_TOKEN": TOKEN}
        done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "agents_stream.ops.cli",
                                       "conversations", "delete", cid, "--by", "test"],
                                       env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        await eventually(lambda: _gone(client, cid), timeout=30, what="the conversation gone from its view")

    def last_values(records: list[Any]) -> dict[str, bytes | None]:
        return {json.loads(m.key): m.value for m in records}  # a changelog's keys are JSON strings

    def ours(m: Any) -> bool:
        return m.key is not None and json.loads(m.key).split("\x1f")[0] == cid

    conversation = last_values(await read_topic(
        f"{c.app_id}-conversations-changelog", keep=ours, timeout=30,
        until=lambda seen: last_values(seen).get(cid, b"") is None))
    kinds = sorted(k.split("\x1f")[1] if "\x1f" in k else "head" for k in conversation)
    assert kinds == ["head", "i", "i", "i", "i", "m", "m"], kinds  # the head, 4 history items, 2 messages
    assert all(v is None for v in conversation.values()), "every key's last record is a tombstone"
    tasks = last_values(await read_topic(
        f"{c.app_id}-tasks-changelog", keep=lambda m: m.key is not None and json.loads(m.key) in rounds, timeout=30,
        until=lambda seen: all(last_values(seen).get(r, b"") is None for r in rounds)))
    assert set(tasks) == set(rounds) and all(v is None for v in tasks.values()), "each round's record too"


async def _gone(client: Client, cid: str) -> bool:
    return await client.conversation(cid) is None


async def test_a_conversation_token_opens_that_conversation_to_its_end_user_and_nothing_else(
    cluster_factory, fake_llm,
):
    agent = unique("plain")
    c = cluster_factory([agent], fake_llm.url, AGENTS_STREAM_API_TOKEN=TOKEN,
                        AGENTS_STREAM_CONVERSATION_SECRET="conversation-secret-" + "x" * 20)
    worker = await c.started("a")
    url = _worker_url(worker)
    cid, other = unique("conv"), unique("conv")
    fake_llm.enqueue(ok("Hello, Ana."))
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/conversations/{cid}/token", json={"ttl_s": 600},
                             headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            assert resp.status == 200
            user_token = (await resp.json())["token"]
        async with Client(url, user_token) as client:  # what a browser holding the token can do
            sent = await client.send(cid, agent, "hi, I am Ana")
            reply = await client.reply(cid, sent.message_id, timeout=60)
            assert reply["text"] == "Hello, Ana."
            assert (await client.conversation(cid))["status"] == "idle"  # type: ignore[index]
            events = [e.kind async for e in _until_reply(client.events(cid, timeout=30))]
            assert events[0] == "message" and events[-1] == "reply"
        refused = [
            ("GET", f"/conversations/{other}"), ("POST", f"/conversations/{other}/messages"),
            ("GET", f"/conversations/{other}/events"), ("POST", f"/conversations/{cid}/delete"),
            ("POST", f"/conversations/{cid}/token"), ("GET", f"/tasks/{reply['task_id']}"), ("GET", "/approvals"),
            ("GET", "/recent"), ("GET", "/dlq"),
        ]
        for method, path in refused:
            body = {"agent_name": agent, "text": "x"} if method == "POST" else None
            async with http.request(method, url + path, json=body,
                                    headers={"Authorization": f"Bearer {user_token}"}) as resp:
                assert resp.status == 401, (method, path, resp.status)
        async with http.post(f"{url}/conversations/{cid}/token", json={"ttl_s": 1},
                             headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            short = (await resp.json())["token"]
        await asyncio.sleep(2.1)
        async with http.get(f"{url}/conversations/{cid}", headers={"Authorization": f"Bearer {short}"}) as resp:
            assert resp.status == 401, "an expired token opens nothing"


async def _until_reply(events: Any) -> Any:
    async for event in events:
        yield event
        if event.kind == "reply":
            return


async def test_an_idle_conversation_expires(cluster_factory, fake_llm):
    agent = unique("plain")
    c = cluster_factory([agent], fake_llm.url, AGENTS_STREAM_API_TOKEN=TOKEN, AGENTS_STREAM_CONVERSATION_IDLE_S="4",
                        AGENTS_STREAM_EXPIRY_INTERVAL_S="1")
    worker = await c.started("a")
    cid = unique("conv")
    fake_llm.enqueue(ok("Hello."))
    async with Client(_worker_url(worker), TOKEN) as client:
        sent = await client.send(cid, agent, "hello")
        await client.reply(cid, sent.message_id, timeout=60)
        assert await client.conversation(cid) is not None
        await eventually(lambda: _gone(client, cid), timeout=30, what="the idle conversation deleted")


async def test_an_interrupting_message_during_a_refund_is_answered_by_the_same_round(cluster_factory, fake_llm):
    """`interrupt`: the second message lands while the refund runs. The refund finishes and is journaled (never
    stopped between the effect and its entry), the round stops at that safe point, and goes on with the message in
    its conversation: one round, one reply answering both, one refund, no model turn asked twice."""
    async with FakeServices() as services:
        _, worker, (agent,) = await start_support(cluster_factory, fake_llm, services, "interrupt")
        cid, order = unique("conv"), unique("o")
        script = support_script(order)
        fake_llm.enqueue(script[0], script[1], script[2], ok("Refunded, and your address is changed too."))
        services.delay("payment.refund", 5)
        async with Client(_worker_url(worker), TOKEN) as client:
            first = await client.send(cid, agent, f"My package {order} never came", context_data={"order_id": order})
            round1 = round_task_id(cid, 1, PARTITIONS, first.offset)
            await eventually(lambda: [k for k in services.executed("payment.refund") if k.startswith(round1)],
                             timeout=60, what="the refund in flight")
            second = await client.send(cid, agent, "also, please change my address")
            reply = await client.reply(cid, first.message_id, timeout=90)
        assert reply["message_ids"] == [first.message_id, second.message_id] and reply["round"] == 1, reply
        assert reply["text"] == "Refunded, and your address is changed too."
        assert len([k for k in services.executed("payment.refund") if k.startswith(round1)]) == 1
        assert turns_asked(fake_llm, round1) == [0, 1, 2, 3], "no turn asked twice"
        (told,) = [r for r in fake_llm.requests if r.task_id == round1 and turn_of(r) == 2]
        assert "please change my address" in _said(told), "the turn after the refund is told the new message"
        assert round_task_id(cid, 2, PARTITIONS, first.offset) not in {r.task_id for r in fake_llm.requests}
