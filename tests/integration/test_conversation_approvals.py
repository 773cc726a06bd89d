"""The support case in a conversation with a human in it: a refund above the agent's approval rule waits for a
lead, the customer and the console see the conversation waiting, the lead's approval lets the round go on, and the
refund happens once; the customer's next message is answered with the whole history."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import aiohttp

from agents_stream.client import Client
from agents_stream.contract.conversation_messages import round_task_id
from agents_stream.examples.services import FakeServices
from agents_stream.testing.fakellm import call, ok, tool_calls

from .harness import PARTITIONS, eventually, unique
from .test_agents import turns_asked
from .test_conversations import TOKEN, _replies, _said, _watch, _worker_url, start_support


async def _waiting_for_a_human(client: Client, cid: str) -> dict[str, Any] | None:
    view = await client.conversation(cid)
    return view if view is not None and view["status"] == "waiting_for_approval" else None


async def test_a_large_refund_in_a_conversation_waits_for_a_human_then_refunds_once(cluster_factory, fake_llm):
    async with FakeServices() as services:
        _, worker, (agent,) = await start_support(cluster_factory, fake_llm, services)
        cid, order = unique("conv"), unique("o")
        fake_llm.enqueue(tool_calls(call("lookup_order", {"order_id": order})),
                         tool_calls(call("create_label", {"order_id": order}),
                                    call("refund", {"order_id": order, "amount": 420.0})))
        text = f"My package {order} never came, refund the 420 I paid"
        seen: list[Any] = []
        async with Client(_worker_url(worker), TOKEN) as client:
            sent = await client.send(cid, agent, text, context_data={"order_id": order})
            round1 = round_task_id(cid, 1, PARTITIONS, sent.offset)
            view = await eventually(lambda: _waiting_for_a_human(client, cid), timeout=60,
                                    what="the conversation waiting for a human")
            inbox = (await worker.get("/approvals"))["awaiting"]
            mine = [a for a in inbox if a["task_id"] == round1]
            assert len(mine) == 1 and mine[0]["reason"] == "tool refund: amount 420 > 100", inbox
            assert not services.executed("payment.refund"), "nothing is refunded before the lead decides"
            assert [x.operation for x in services.calls if x.operation == "carrier.label"], "the turn's label ran"
            assert [m["id"] for m in view["waiting"]] == [sent.message_id], "not answered yet"

            fake_llm.enqueue(ok("Refunded 420 and sent a return label."))
            async with aiohttp.ClientSession() as s, s.post(
                f"{_worker_url(worker)}/approvals/{quote(round1, safe='')}",  # a round's id holds '#' and '@'
                json={"decision": "approve", "by": "lead-ann", "parked": mine[0]["parked"]},
                headers={"Authorization": f"Bearer {TOKEN}"},
            ) as r:
                assert r.status == 202, await r.text()
            reply = await client.reply(cid, sent.message_id, timeout=90)
            await asyncio.wait_for(_watch(_worker_url(worker), cid, seen, after=None), 30)  # every event to the reply
            assert reply["text"] == "Refunded 420 and sent a return label." and reply["status"] == "succeeded"
            refunds = services.executed("payment.refund")
            assert len(refunds) == 1 and refunds[0].startswith(round1 + ":1:"), refunds
            assert turns_asked(fake_llm, round1) == [0, 1, 2], "no turn is asked again after the wait"
            kinds = [e.kind for e in seen]
            assert kinds.index("waiting_for_approval") < kinds.index("reply"), kinds

            fake_llm.enqueue(ok("That order was the only one refunded."))
            follow = await client.send(cid, agent, "was anything else refunded?")
            second = await client.reply(cid, follow.message_id, timeout=90)
            done = await client.conversation(cid)
        assert second["round"] == 2 and second["text"].startswith("That order")
        asked = [r for r in fake_llm.requests if r.task_id == round_task_id(cid, 2, PARTITIONS, sent.offset)]
        said = _said(asked[0])
        assert said.index(text) < said.index("Refunded 420") < said.index("was anything else refunded?"), said
        assert len(services.executed("payment.refund")) == 1
        assert done is not None and done["status"] == "idle" and done["rounds"] == 2, done
        assert {i for r in await _replies(cid, 2) for i in r["message_ids"]} == {sent.message_id, follow.message_id}
