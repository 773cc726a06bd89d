"""Routing across handlers on the real broker: a worker process, the fake LLM over HTTP for the handlers and another
for the route's classifier. A desk agent routes each message of a conversation: a rule sends an FAQ to the one-call
handler, the classifier sends a complaint to the tool-using agent, a refusal of the one-call handler escalates to
the agent with what it gathered, and a worker SIGKILLed after a round's route was journaled does not route again
(the classifier is asked once for that round: its requests are counted at the fake)."""

from __future__ import annotations

from urllib.parse import quote

from agents_stream.client import Client
from agents_stream.contract.conversation_messages import round_task_id
from agents_stream.examples.services import FakeServices
from agents_stream.testing.fakellm import FakeLLM, hang, ok, refusal

from .harness import PARTITIONS, eventually, unique
from .test_agents import agent_toml, providers_toml
from .test_conversations import TOKEN, _said, _worker_url


def desk_toml(fake_url: str, classifier_url: str, desk: str, faq: str, support: str) -> str:
    return (providers_toml(fake_url, ("openai",)) + providers_toml(classifier_url, ("openai",), prefix="small")
            + f'[agents.{faq}]\nproviders = ["p_openai"]\ndescription = "questions about opening hours and shipping"\n'
            + agent_toml(support, ["p_openai"])
            + f'[agents.{desk}]\n'
            + f'[agents.{desk}.routing]\nhandlers = ["{faq}", "{support}"]\nclassifier = "small_openai"\n'
            + f'[[agents.{desk}.routing.rules]]\nhandler = "{faq}"\nwords = ["opening hours"]\n')


async def _round(worker, task_id: str) -> dict:
    record = await worker.get("/tasks/" + quote(task_id, safe=""))
    assert isinstance(record, dict) and record.get("result"), record
    return record["result"]


async def test_a_desk_routes_by_rule_and_classifier_escalates_and_a_kill_after_the_decision_does_not_route_again(
    cluster_factory, fake_llm,
):
    async with FakeServices() as services, FakeLLM(default=None) as small:
        desk, faq, support = unique("desk"), unique("faq"), unique("support")
        c = cluster_factory([desk, faq, support], None, toml=desk_toml(fake_llm.url, small.url, desk, faq, support),
                            AGENTS_STREAM_REFUND_SERVICES=services.url, AGENTS_STREAM_API_TOKEN=TOKEN)
        worker = await c.started("a")
        cid = unique("conv")
        async with Client(_worker_url(worker), TOKEN) as client:
            # 1. a rule: the FAQ goes to the one-call handler; the classifier is not asked
            fake_llm.enqueue(ok("We are open 9 to 5."))
            first = await client.send(cid, desk, "What are your opening hours?")
            reply = await client.reply(cid, first.message_id, timeout=90)
            assert reply["text"] == "We are open 9 to 5." and small.requests == []
            round1 = round_task_id(cid, 1, PARTITIONS, first.offset)
            result = await _round(worker, round1)
            route = result["transcript"]["route"]
            assert route["first"] == faq and route["by"] == "rule" and "opening hours" in route["reason"]
            assert route["escalations"] == [] and route["source"] is None

            # 2. no rule: the classifier (a small model at its own fake) sends it to the tool-using agent
            small.enqueue(ok(support, input_tokens=40, output_tokens=2))
            fake_llm.enqueue(ok("I am sorry; I have opened a case for you."))
            second = await client.send(cid, desk, "Your courier was rude to me.")
            reply = await client.reply(cid, second.message_id, timeout=90)
            assert reply["text"] == "I am sorry; I have opened a case for you." and len(small.requests) == 1
            assert "Your courier was rude to me." in _said(small.requests[0])
            result = await _round(worker, round_task_id(cid, 2, PARTITIONS, first.offset))
            route = result["transcript"]["route"]
            assert route["first"] == support and route["by"] == "classifier"
            assert route["usage"]["input_tokens"] == 40 and route["source"].startswith("classifier:small_openai")
            assert result["usage"]["input_tokens"] >= 40  # the classifier's tokens count in the round's usage

            # 3. escalation: the one-call handler refuses; the agent answers, told what the weaker one came to
            fake_llm.enqueue(refusal(), ok("On Sundays we are closed."))
            third = await client.send(cid, desk, "And the opening hours on Sunday?")
            reply = await client.reply(cid, third.message_id, timeout=90)
            assert reply["text"] == "On Sundays we are closed." and len(small.requests) == 1
            round3 = round_task_id(cid, 3, PARTITIONS, first.offset)
            result = await _round(worker, round3)
            route = result["transcript"]["route"]
            assert route["first"] == faq and route["handler"] == support
            assert [(e["from"], e["to"]) for e in route["escalations"]] == [(faq, support)]
            asked = [r for r in fake_llm.requests if r.task_id and r.task_id.startswith(round3)]
            assert len(asked) == 2 and "Earlier handlers of this message could not answer it" in _said(asked[1])
            assert f"[task_id={round3}~{support}]" in _said(asked[1]), "the stronger handler's keys are its own"
            kinds = []
            async for event in client.events(cid, timeout=30):  # the stream shows each decision and escalation
                kinds.append(event.kind)
                if event.kind == "reply" and event.data.get("round") == 3:
                    break
            assert kinds.count("routed") == 3 and kinds.count("escalated") == 1

            # 4. a kill after round 4's route was journaled: its handler's model call hangs when the worker dies
            small.enqueue(ok(support))
            fake_llm.enqueue(hang(60))
            fourth = await client.send(cid, desk, "I want to speak about my last invoice.")
        round4 = round_task_id(cid, 4, PARTITIONS, first.offset)
        await eventually(lambda: any(r.task_id == round4 for r in fake_llm.requests), timeout=60,
                         what="round 4's handler asked (after its route was journaled)")
        assert len(small.requests) == 2
        worker.kill()
        fake_llm.enqueue(ok("Your invoice is being checked."))
        worker = await c.started("a")
        async with Client(_worker_url(worker), TOKEN) as client:
            await client.send(cid, desk, "I want to speak about my last invoice.", message_id=fourth.message_id)
            reply = await client.reply(cid, fourth.message_id, timeout=90)
        assert reply["text"] == "Your invoice is being checked."
        assert len(small.requests) == 2, "the round taken over after the kill asked the classifier again"
        assert len([r for r in fake_llm.requests if r.task_id == round4]) == 2  # the hung call, then the answer
        route = (await _round(worker, round4))["transcript"]["route"]
        assert route["first"] == support and route["by"] == "classifier" and route["escalations"] == []

