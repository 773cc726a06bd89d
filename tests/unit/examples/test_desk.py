"""The support desk example (docs/examples/desk.toml, agents_stream/examples/desk.py) without a broker: its rules
send each kind of message of the benchmark's mix where the guide says, and its order-status chain answers in words
from the order service, once per key."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents_stream import StepContext
from agents_stream.config import load_config
from agents_stream.contract.models import TaskPayload
from agents_stream.examples.desk import ORDER_STATUS, order_of
from agents_stream.examples.services import FakeServices
from agents_stream.execution.routing_definitions import RouteMessage, Routing
from bench.b8_desk import MIX

DESK = Path(__file__).resolve().parents[3] / "docs" / "examples" / "desk.toml"
#: where each kind of the mix goes by the rules (None: no rule matches, the classifier is asked)
BY_RULE = {"faq": "faq", "status": "orders", "refund": "support", "faq_classified": None, "complaint": None}


def test_the_desks_rules_send_each_message_of_the_mix_to_its_handler() -> None:
    config = load_config(DESK)
    routing = config.agents["desk"].routing
    assert routing is not None
    route = Routing.from_config(routing)
    assert list(route.handlers) == ["faq", "orders", "support"]
    for text, kind in MIX:
        decided = route.decide(RouteMessage(text=text.format(order="o-1042"), context={}))
        assert (decided[0] if decided else None) == BY_RULE[kind], (text, decided)
    assert route.decide(RouteMessage(text="Where is my order o-1, I want a refund", context={}))[0] == "support"


def _ctx(instruction: str, context: dict | None = None, key: str = "conv#1:lookup") -> StepContext:
    task = TaskPayload(task_id="conv#1", agent_name="orders", instruction=instruction, context_data=context or {})
    return StepContext(task=task, step="lookup", key=key, attempt=1)


def test_the_order_named_by_the_form_else_the_last_one_said() -> None:
    assert order_of(_ctx("Where is o-1? No, I meant o-2.")) == "o-2"
    assert order_of(_ctx("Where is o-1?", {"order_id": "o-9"})) == "o-9"
    with pytest.raises(ValueError, match="names no order"):
        order_of(_ctx("Where is my order?"))


async def test_the_order_status_chain_says_the_order_in_words(monkeypatch: pytest.MonkeyPatch) -> None:
    async with FakeServices() as services:
        monkeypatch.setenv("AGENTS_STREAM_REFUND_SERVICES", services.url)
        step = ORDER_STATUS.step("lookup")
        order = await step.action(_ctx("Where is my order o-1042?"))
        again = await step.action(_ctx("Where is my order o-1042?"))
    assert again == order and services.executed("orders.lookup") == ["conv#1:lookup"]
    assert ORDER_STATUS.result is not None
    assert ORDER_STATUS.result({"lookup": order}) == "Your order o-1042 is delivered (amount 42.50)."
