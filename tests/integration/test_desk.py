"""The support desk example (docs/examples/desk.toml, agents_stream/examples/desk.py) end to end on the real broker:
one worker runs the example's config as written (its agents renamed for this test, its models pointed at the fake
LLM), a customer writes to it over HTTP. An FAQ is answered by one call of the small model, an order status by the
chain with no model call, a refund above 100 by the support agent after a lead approves it over HTTP, and the
refund takes effect once at the payment service. The desk's console view lists the conversation and its routes."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote

import aiohttp

from agents_stream.client import Client
from agents_stream.contract.conversation_messages import round_task_id
from agents_stream.examples.services import FakeServices
from agents_stream.testing.fakellm import FakeLLM, call, ok, tool_calls

from .harness import PARTITIONS, eventually, unique
from .test_conversations import TOKEN, _worker_url

DESK_TOML = Path(__file__).resolve().parents[2] / "docs" / "examples" / "desk.toml"
NAMES = ("desk", "faq", "orders", "support")


def desk_config(llm_url: str) -> tuple[str, dict[str, str]]:
    """The example's config with this test's agent names (a topic per agent, shared by every test on the broker)
    and its providers at ``llm_url``; the names by their role."""
    names = {n: unique(n) for n in NAMES}
    text = DESK_TOML.read_text().replace("http://127.0.0.1:8089", llm_url)
    text = re.sub(r"(\[+agents\.)(desk|faq|orders|support)\b", lambda m: m[1] + names[m[2]], text)
    text = re.sub(r'"(desk|faq|orders|support)"', lambda m: f'"{names[m[1]]}"', text)
    return text, names


def asked(fake: FakeLLM, round_id: str) -> list[str]:
    """The models asked while answering a round (its handlers' calls, escalated ones' too), in order."""
    return [r.model for r in fake.requests if r.task_id and r.task_id.startswith(round_id)]


async def test_the_desk_answers_each_message_with_the_cheapest_handler_and_refunds_once(cluster_factory):
    async with FakeServices() as services, FakeLLM(default=None) as fake:
        toml, names = desk_config(fake.url)
        c = cluster_factory(list(names.values()), None, toml=toml, AGENTS_STREAM_REFUND_SERVICES=services.url,
                            AGENTS_STREAM_API_TOKEN=TOKEN)
        worker = await c.started("a")
        desk, cid, order = names["desk"], unique("conv"), "o-" + unique("x")[2:]
        async with Client(_worker_url(worker), TOKEN) as client:
            # 1. an FAQ: a rule sends it to the one-call handler, the small model answers
            fake.enqueue(ok("We are open 9:00 to 17:00, Monday to Saturday."))
            first = await client.send(cid, desk, "What are your opening hours?")
            reply = await client.reply(cid, first.message_id, timeout=90)
            assert reply["text"] == "We are open 9:00 to 17:00, Monday to Saturday."
            round1 = round_task_id(cid, 1, PARTITIONS, first.offset)
            assert asked(fake, round1) == ["fake-small"], "one call, of the small model"

            # 2. an order status: the chain looks the order up and says it; no model is asked
            second = await client.send(cid, desk, f"Where is my order {order}?")
            reply = await client.reply(cid, second.message_id, timeout=90)
            assert reply["text"] == f"Your order {order} is delivered (amount 42.50)."
            assert asked(fake, round_task_id(cid, 2, PARTITIONS, first.offset)) == []
            assert len(services.executed("orders.lookup")) == 1

            # 3. a refund above 100: the support agent looks up, labels, asks to refund 120 → a lead approves
            fake.enqueue(tool_calls(call("lookup_order", {"order_id": order})),
                         tool_calls(call("create_label", {"order_id": order}),
                                    call("refund", {"order_id": order, "amount": 120.0})))
            third = await client.send(cid, desk, f"The parcel {order} arrived broken, I want a refund of 120.")
            round3 = round_task_id(cid, 3, PARTITIONS, first.offset)

            async def parked() -> list[dict] | None:
                mine = [a for a in (await worker.get("/approvals"))["awaiting"] if a["task_id"] == round3]
                return mine or None

            mine = await eventually(parked, timeout=60, what="the refund waiting for a lead")
            assert mine[0]["reason"] == "tool refund: amount 120 > 100", mine
            assert services.executed("payment.refund") == [], "nothing is refunded before the lead decides"
            view = await desk_view(worker, desk)
            row = next(r for r in view["conversations"] if r["conversation_id"] == cid)
            assert row["handler"] == names["support"] and row["status"] == "waiting_for_approval", row
            assert row["waiting_s"] is not None and row["waiting_s"] >= 0, row

            fake.enqueue(ok("Refunded 120.00 and sent a return label."))
            async with aiohttp.ClientSession() as s, s.post(
                f"{_worker_url(worker)}/approvals/{quote(round3, safe='')}",
                json={"decision": "approve", "by": "lead-ann", "parked": mine[0]["parked"]},
                headers={"Authorization": f"Bearer {TOKEN}"},
            ) as r:
                assert r.status == 202, await r.text()
            reply = await client.reply(cid, third.message_id, timeout=90)
            assert reply["text"] == "Refunded 120.00 and sent a return label." and reply["status"] == "succeeded"
            assert asked(fake, round3) == ["fake-large"] * 3, "look up, label and refund, then the answer"
            refunds = services.effects("payment.refund", "order_id")
            assert list(refunds) == [order] and len(refunds[order]) == 1, refunds
            assert [c.body for c in services.calls if c.operation == "payment.refund" and not c.replay] == [
                {"order_id": order, "amount": 120.0}]

            kinds = []
            async for event in client.events(cid, timeout=30):  # the stream shows each round's route
                kinds.append((event.kind, (event.data.get("data") or {}).get("handler")))
                if event.kind == "reply" and event.data.get("round") == 3:
                    break
            assert [h for k, h in kinds if k == "routed"] == [names["faq"], names["orders"], names["support"]]
            assert not [k for k, _ in kinds if k == "escalated"]
        assert not [r for r in fake.requests if r.model == "fake-small" and r.task_id and "~" in r.task_id]
        assert len([r for r in fake.requests if r.model == "fake-small"]) == 1, "the classifier was never asked"
        assert cid not in [r["conversation_id"] for r in (await desk_view(worker, desk))["conversations"]]
        view = await desk_view(worker, desk, "?all=1")  # answered: listed only with the idle ones
        row = next(r for r in view["conversations"] if r["conversation_id"] == cid)
        assert row["status"] == "idle" and row["waiting_s"] is None and row["rounds"] == 3, row
        assert [x["handler"] for x in row["routes"]] == [names["faq"], names["orders"], names["support"]], row
        page, script = await worker.get("/"), await worker.get("/console/desk.js")  # the console's desk panel
        assert 'id="desk-table"' in page and '"/desk/" + encodeURIComponent(agent)' in script


async def desk_view(worker, desk: str, query: str = "") -> dict:
    """The desk's console view over real HTTP, with the read token (``GET /desk/<agent>``)."""
    got = await worker.get(f"/desk/{desk}{query}")
    assert isinstance(got, dict) and "conversations" in got, got
    return got
