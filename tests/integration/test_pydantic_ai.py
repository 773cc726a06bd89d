"""A Pydantic AI agent, unchanged, run durably on the real broker: worker processes run the worked example
(agents_stream/examples/pydantic_support.py), its own OpenAI client talks to the fake LLM over HTTP, its tools to the
example services; SIGKILL right after the refund."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from agents_stream.contract import topics
from agents_stream.examples.services import FakeServices
from agents_stream.testing.fakellm import FakeLLM, call, hang, ok, tool_calls

from .harness import encode, eventually, produce, results_for, task, unique

SUPPORT = "agents_stream.examples.pydantic_support:SUPPORT"


def config(agent: str) -> str:
    """No providers: the agent brings its own model client."""
    return f'[providers]\n\n[agents.{agent}]\nagent = "{SUPPORT}"\n'


def turns_asked(fake: FakeLLM, task_id: str) -> list[int]:
    """Per model request of the task, which turn it asks for: the number of assistant turns it carries."""
    return [sum(1 for m in (r.body or {}).get("messages", []) if m.get("role") == "assistant")
            for r in fake.requests if r.task_id == task_id]


def refund_task(agent: str) -> dict[str, Any]:
    t = task(agent, instruction="The customer wants a refund for their order.")
    t["context_data"] = {"order_id": unique("o")}
    return t


async def result_of(t: dict[str, Any], timeout: float = 90) -> dict[str, Any]:
    return json.loads((await results_for({t["task_id"]}, timeout=timeout))[t["task_id"]][0].value)


async def test_a_pydantic_ai_agent_killed_after_its_refund_finishes_on_another_worker_with_one_refund(
    cluster_factory, fake_llm,
):
    """Turn 0 looks the order up, turn 1 refunds; SIGKILL the worker while turn 2 is in flight. A second
    worker finishes the task from its journal: the payment service applied one refund, the task has one result, and
    only the request in flight at the kill is asked again (turns 0 and 1 are not)."""
    async with FakeServices() as services:
        agent = unique("pydantic_support")
        c = cluster_factory([agent], None, toml=config(agent), AGENTS_STREAM_REFUND_SERVICES=services.url,
                            AGENTS_STREAM_EXAMPLE_LLM=f"{fake_llm.url}/v1")
        first = await c.started("a")
        t = refund_task(agent)
        order = t["context_data"]["order_id"]
        fake_llm.enqueue(tool_calls(call("lookup_order", {"order_id": order})),
                         tool_calls(call("refund", {"order_id": order, "amount": 42.5})),
                         hang(60))
        await produce(topics.task_topic(agent), [encode(t)])
        await eventually(lambda: 2 in turns_asked(fake_llm, t["task_id"]), timeout=60, what="turn 2 in flight")
        assert services.executed("payment.refund"), "the refund took effect before the kill"
        first.kill()
        fake_llm.enqueue(ok("Refunded 42.50 to the customer's card."))
        second = await c.started("b")  # a worker of its own (data dir, id): it takes the task over from the journal
        result = await result_of(t)
        asked = turns_asked(fake_llm, t["task_id"])
        refunds = [x for x in services.calls if x.operation == "payment.refund" and x.key.startswith(t["task_id"])]
        lookups = [x for x in services.calls if x.operation == "orders.lookup" and x.key.startswith(t["task_id"])]
        print(f"\npydantic_ai: model requests per turn {asked}; refund calls {[(x.key, x.replay) for x in refunds]}; "
              f"effects {len(services.executed('payment.refund'))}")
        assert result["status"] == "succeeded" and result["output"] == "Refunded 42.50 to the customer's card."
        assert asked == [0, 1, 2, 2], "only the request in flight at the kill is asked again"
        assert len(refunds) == 1 and len(services.executed("payment.refund")) == 1, "one refund, run once"
        assert len(lookups) == 1, "the journaled lookup is not run again"
        assert refunds[0].key == f"{t['task_id']}:1:{_call_id(result, 'refund')}", "the call's key reached the service"
        results = await results_for({t["task_id"]}, timeout=5)
        assert len({r.value for r in results[t["task_id"]]}) == 1, "one distinct result"
        view = await second.get(f"/tasks/{quote(t['task_id'], safe='')}")
        assert f":{second.proc.pid}:" in view["owner"], "the second worker finished it"
        turns = result["transcript"]["turns"]
        assert [x["tool_calls"] for x in turns] == [["lookup_order"], ["refund"], []]
        assert all(x["source"] == "pydantic_ai:fake-model" for x in turns)


def _call_id(result: dict[str, Any], tool: str) -> str:
    return next(c["id"] for c in result["transcript"]["tool_calls"] if c["name"] == tool)
