"""An unchanged OpenAI Agents SDK agent on the real broker: the example support agent (agents_stream/examples/
openai_agents_support.py) in worker processes, its own OpenAI client pointed at the fake LLM over HTTP, the example
services counting effects; a SIGKILL after the refund."""

from __future__ import annotations

from agents_stream.examples.services import FakeServices

from .harness import unique
from .test_agents import kill_after_the_refund_is_journaled, result_of, turns_asked

EXAMPLE = "agents_stream.examples.openai_agents_support:SUPPORT"


async def test_an_openai_agents_sdk_agent_killed_after_the_refund_resumes_without_a_second_refund(
    cluster_factory, fake_llm,
):
    """SIGKILL after `refund` ran and its result was journaled, while the SDK's next model request is in flight: the
    restarted worker replays turns 0 and 1 from the journal (not requested again), asks turn 2 again, runs no
    journaled tool again; the payment service saw one refund and the task has one result."""
    async with FakeServices() as services:
        agent = unique("oai_support")
        toml = f'[providers]\n[agents.{agent}]\nagent = "{EXAMPLE}"\n'  # its own model client: no providers
        c = cluster_factory([agent], None, toml=toml, AGENTS_STREAM_REFUND_SERVICES=services.url,
                            OPENAI_BASE_URL=f"{fake_llm.url}/v1", OPENAI_API_KEY="fake-key")
        t = await kill_after_the_refund_is_journaled(c, agent, fake_llm, services)
        result = await result_of(t)
        asked = turns_asked(fake_llm, t["task_id"])
        mine = [x for x in services.calls if x.key.startswith(t["task_id"] + ":")]
        refunds = [x for x in mine if x.operation == "payment.refund"]
        print(f"\nopenai agents: turns asked {asked}; refund calls {[(x.key, x.replay) for x in refunds]}; "
              f"effects {[x.operation for x in mine if not x.replay]}")
        assert result["status"] == "succeeded", result
        assert result["output"] == "Refunded 42.50 and sent a return label."
        assert asked == [0, 1, 2, 2, 3], "only the request in flight at the kill is asked again"
        assert len(refunds) == 1 and len(services.executed("payment.refund")) == 1
        assert refunds[0].key.startswith(f"{t['task_id']}:1:"), "the key is <task_id>:<turn>:<call_id>"
        assert sorted(x.operation for x in mine) == [
            "carrier.label", "mail.send", "orders.lookup", "payment.refund"], "each tool ran once"
        turns = result["transcript"]["turns"]
        assert [tt["tool_calls"] for tt in turns] == [
            ["lookup_order"], ["create_label", "refund"], ["notify_customer"], []]
        assert turns[0]["source"] == "openai_agents:fake-model" and result["usage"]["input_tokens"] > 0
