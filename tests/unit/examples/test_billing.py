"""The billing agent of the partition tests: a loop the fake LLM's responder drives per task (no script), one charge
per account counted as an effect by the payment service, a repeated key a replay (over HTTP, no broker; the loop
through the public harness, agents_stream.testing)."""

from __future__ import annotations

import pytest

from agents_stream.config import AppConfig
from agents_stream.examples.billing import BILLING
from agents_stream.examples.services import FakeServices, call_service
from agents_stream.providers import build_provider
from agents_stream.testing import ProviderModel, run_agent
from agents_stream.testing.fakellm import FakeLLM, RecordedRequest, Reply, call, ok, tool_calls


def respond(request: RecordedRequest, turn: int) -> Reply | None:
    if request.task_id != "bill-1":
        return None  # the script's
    if turn == 0:
        return tool_calls(call("lookup_account", {"account": "a-1"}))
    if turn == 1:
        return tool_calls(call("charge", {"account": "a-1", "amount": 42.5}))
    return ok("Charged a-1 42.50.")


async def test_the_billing_agent_charges_once_and_the_service_counts_effects_per_account(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with FakeLLM(default=None, responder=respond) as fake, FakeServices() as services:
        monkeypatch.setenv("AGENTS_STREAM_REFUND_SERVICES", services.url)
        config = AppConfig.model_validate({
            "providers": {"fake": {"kind": "openai", "base_url": f"{fake.url}/v1", "model": "fake-model"}},
            "agents": {"billing": {"providers": ["fake"], "agent": "agents_stream.examples.billing:BILLING"}},
        })
        assert [t.name for t in BILLING.tools] == ["lookup_account", "charge"]
        provider = build_provider(config.provider("fake"))
        try:
            run = await run_agent(BILLING, "Charge account a-1", task_id="bill-1", model=ProviderModel(provider))
        finally:
            await provider.close()
        key = services.executed("payment.charge")[0]
        # the same key again (a retry): a replay at the service, no second effect
        assert (await call_service("payment.charge", key, {"account": "a-1", "amount": 42.5}))[0] == 200
        # another key for the same account (a second decision to charge): a second effect, counted
        assert (await call_service("payment.charge", "other", {"account": "a-1", "amount": 42.5}))[0] == 200
        # the account service answers what any account owes
        assert (await call_service("accounts.lookup", "k", {"account": "a-2"}))[1]["account"]["owes"] == 42.5
    assert run.status == "succeeded" and run.output == "Charged a-1 42.50." and run.tool_names == [
        "lookup_account", "charge"]
    assert key.startswith("bill-1:1:") and [r.task_id for r in fake.requests] == ["bill-1"] * 3
    assert services.effects("payment.charge", "account") == {"a-1": [key, "other"]}
    assert [c.replay for c in services.calls if c.operation == "payment.charge"] == [False, True, False]
