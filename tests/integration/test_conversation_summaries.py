"""Summaries of a conversation's older history on the real broker: a worker process, the fake LLM over HTTP for the
agent and another for its summary provider — each round folds only what fell out of its window into the summary
so far, and a round killed after its summary was journaled is finished without asking the summariser again."""

from __future__ import annotations

import json

from agents_stream.client import Client
from agents_stream.contract.conversation_messages import round_task_id
from agents_stream.examples.services import FakeServices
from agents_stream.execution.history import HEADER
from agents_stream.testing.fakellm import FakeLLM, hang, ok

from .harness import PARTITIONS, eventually, unique
from .test_agents import agent_toml, providers_toml
from .test_conversations import TOKEN, _said, _worker_url


async def test_older_history_is_summarised_incrementally_and_a_kill_does_not_summarise_twice(
    cluster_factory, fake_llm,
):
    async with FakeServices() as services, FakeLLM(default=None) as cheap:
        cheap.enqueue(ok("S1: the customer asked question 1."), ok("S2: questions 1 and 2 were answered."))
        agent = unique("support")
        toml = (providers_toml(fake_llm.url, ("openai",)) + providers_toml(cheap.url, ("openai",), prefix="cheap")
                + agent_toml(agent, ["p_openai"]).replace(f"[agents.{agent}]\n",
                                                          f"[agents.{agent}]\nhistory_messages = 2\n", 1)
                + f'[agents.{agent}.summary]\nprovider = "cheap_openai"\n')
        c = cluster_factory([agent], None, toml=toml, AGENTS_STREAM_REFUND_SERVICES=services.url,
                            AGENTS_STREAM_API_TOKEN=TOKEN)
        worker = await c.started("a")
        cid = unique("conv")
        async with Client(_worker_url(worker), TOKEN) as client:
            sent = []
            for n in (1, 2, 3):
                fake_llm.enqueue(ok(f"answer {n}"))
                sent.append(await client.send(cid, agent, f"question {n}"))
                reply = await client.reply(cid, sent[-1].message_id, timeout=90)
                assert reply["text"] == f"answer {n}"
            assert len(cheap.requests) == 1, "rounds 1 and 2 had nothing older than their window"
            first = json.dumps(cheap.requests[0].body)
            assert "question 1" in first and "answer 1" in first and "question 2" not in first
            fake_llm.enqueue(hang(60))  # round 4's model turn is in flight when the worker is killed
            sent.append(await client.send(cid, agent, "question 4"))
        round4 = round_task_id(cid, 4, PARTITIONS, sent[0].offset)
        await eventually(lambda: any(r.task_id == round4 for r in fake_llm.requests), timeout=60,
                         what="round 4's model turn (asked once its summary is journaled)")
        assert len(cheap.requests) == 2
        second = json.dumps(cheap.requests[1].body)
        assert "S1: the customer asked question 1." in second and "question 2" in second and "answer 2" in second
        assert "Customer: question 1" not in second, "only what fell out of the window since is sent"
        worker.kill()
        fake_llm.enqueue(ok("answer 4"))
        worker = await c.started("a")
        async with Client(_worker_url(worker), TOKEN) as client:
            await client.send(cid, agent, "question 4", message_id=sent[-1].message_id)  # the client's retry
            reply = await client.reply(cid, sent[-1].message_id, timeout=90)
        assert reply["text"] == "answer 4"
        assert len(cheap.requests) == 2, "the round taken over after the kill asked the summariser again"
        asked = [r for r in fake_llm.requests if r.task_id == round4]
        assert len(asked) == 2
        for request in asked:  # the same summary ahead of the same window, before and after the kill
            said = _said(request)
            assert f"{HEADER}\nS2: questions 1 and 2 were answered." in said and "answer 3" in said
            assert "question 1" not in said and "question 2" not in said
