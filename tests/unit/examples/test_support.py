"""The README's support agent example, tested with the public harness (agents_stream.testing): its config names
it, its script drives the loop to one refund, over HTTP against the fake LLM or as a scripted model (no broker)."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from agents_stream.config import load_config
from agents_stream.examples.services import FakeServices
from agents_stream.examples.support import SUPPORT
from agents_stream.providers import build_provider
from agents_stream.testing import ProviderModel, ScriptedModel, call, replay, run_agent, turn
from agents_stream.testing.fakellm import FakeLLM

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"
ANSWER = "Refunded 42.50 and sent a return label."


def script() -> ScriptedModel:
    """docs/examples/support-script.json (the fake LLM's script) as the harness's scripted model."""
    replies = json.loads((EXAMPLES / "support-script.json").read_text())["replies"]
    return ScriptedModel([turn(*(call(c["name"], c["arguments"]) for c in r.get("calls", [])), text=r.get("text", ""))
                          for r in replies])


async def test_the_readme_support_example_refunds_once(monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(EXAMPLES / "support.toml")
    assert config.agents["support"].agent == "agents_stream.examples.support:SUPPORT"
    assert [t.name for t in SUPPORT.tools] == ["lookup_order", "create_label", "refund", "notify_customer"]
    async with FakeLLM(default=None) as fake, FakeServices() as services:
        monkeypatch.setenv("AGENTS_STREAM_REFUND_SERVICES", services.url)
        async with aiohttp.ClientSession() as session:  # the README's curl: the script over the admin API
            async with session.post(f"{fake.url}/_admin/script",
                                    data=(EXAMPLES / "support-script.json").read_bytes()) as r:
                assert r.status == 200 and (await r.json())["script_remaining"] == 4
        provider = build_provider(config.providers["model"].model_copy(update={"base_url": f"{fake.url}/v1"}))
        try:
            run = await run_agent(SUPPORT, "Refund order o-1", task_id="ticket-1", context={"order_id": "o-1"},
                                  model=ProviderModel(provider))
        finally:
            await provider.close()
    assert run.status == "succeeded" and run.output == ANSWER
    assert run.tool_names == ["lookup_order", "create_label", "refund", "notify_customer"]
    assert [c.operation for c in services.calls][0] == "orders.lookup"
    assert len(services.executed("payment.refund")) == 1 and services.executed("mail.send")
    assert fake.script_misses == 0 and len(fake.requests) == 4
    tools_offered = [t["function"]["name"] for t in fake.requests[0].body["tools"]]
    assert tools_offered == ["lookup_order", "create_label", "refund", "notify_customer"]
    assert json.loads(json.dumps(run.journal))[-1]["text"] == ANSWER


async def test_the_support_script_as_a_scripted_model_and_its_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    async with FakeServices() as services:
        monkeypatch.setenv("AGENTS_STREAM_REFUND_SERVICES", services.url)
        run = await run_agent(SUPPORT, "Refund order o-1", context={"order_id": "o-1"}, model=script())
    assert run.status == "succeeded" and run.output == ANSWER
    (refund,) = run.calls_of("refund")
    assert refund.arguments == {"order_id": "o-1", "amount": 42.5} and not refund.error
    assert services.executed("payment.refund") == [refund.key]  # the service got the call's idempotency key
    assert not (await replay(SUPPORT, run.recording())).diverged  # the recording holds for this code
