"""The README's support agent example: its config loads, its script drives the loop to one refund (over HTTP against
the fake LLM and the example services, no broker)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agents_stream.config import load_config
from agents_stream.contract.models import TaskPayload
from agents_stream.examples.services import FakeServices
from agents_stream.execution.agent_loop import Done, Loop
from agents_stream.execution.plan import AgentPlan
from agents_stream.execution.run import TurnAnswer
from agents_stream.providers import build_provider
from agents_stream.providers.conversation import Conversation
from agents_stream.testing.fakellm import FakeLLM

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


async def test_the_readme_support_example_refunds_once(monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(EXAMPLES / "support.toml")
    plan = AgentPlan.build(config, "support", lambda name: build_provider(config.provider(name)))
    assert plan.agent is not None and [t.name for t in plan.agent.tools] == [
        "lookup_order", "create_label", "refund", "notify_customer"]
    async with FakeLLM(default=None) as fake, FakeServices() as services:
        monkeypatch.setenv("AGENTS_STREAM_REFUND_SERVICES", services.url)
        async with aiohttp.ClientSession() as session:  # the README's curl: the script over the admin API
            async with session.post(f"{fake.url}/_admin/script",
                                    data=(EXAMPLES / "support-script.json").read_bytes()) as r:
                assert r.status == 200 and (await r.json())["script_remaining"] == 4
        model = config.providers["model"].model_copy(update={"base_url": f"{fake.url}/v1"})
        provider = build_provider(model)

        async def ask(conv: Conversation) -> TurnAnswer:
            return TurnAnswer(await provider.converse(conv), "primary:model:fake-model", "high", 1, None)

        journal: list[Any] = []

        async def record(index: int, entry: dict[str, Any]) -> None:
            assert index == len(journal)

        task = TaskPayload(task_id="ticket-1", agent_name="support", instruction="Refund order o-1",
                           context_data={"order_id": "o-1"})
        try:
            end = await Loop(plan.agent, task, journal, ask=ask, record=record).run()
        finally:
            await provider.close()
    assert end == Done("Refunded 42.50 and sent a return label.", "high", "primary:model:fake-model")
    assert [c.operation for c in services.calls][0] == "orders.lookup"
    assert len(services.executed("payment.refund")) == 1 and services.executed("mail.send")
    assert fake.script_misses == 0 and len(fake.requests) == 4
    tools_offered = [t["function"]["name"] for t in fake.requests[0].body["tools"]]
    assert tools_offered == ["lookup_order", "create_label", "refund", "notify_customer"]
    assert json.loads(json.dumps(journal))[-1]["text"] == "Refunded 42.50 and sent a return label."
