"""The support desk's Python: the order-status chain, and the two handlers the config names by path.

The desk (``docs/examples/desk.toml``, docs/guide/desk.md) routes each customer message to the cheapest handler
that can answer it:

- a question about opening hours, shipping or returns → ``faq``, one call of a small model (config only: a
  ``system`` prompt, no Python);
- "where is my order" → ``orders``, the fixed chain below: the order looked up at the order service and said in
  one sentence, no model call at all;
- a refund or a dispute (and whatever no rule and no classifier answer claims) → ``support``, the tool-using
  agent of ``agents_stream.examples.support`` (a refund above 100 waits for a person's approval).

Everything here comes through the front door (``from agents_stream import ...``); the services are the fake ones
of ``agents_stream.examples.services`` at ``AGENTS_STREAM_REFUND_SERVICES``.
"""

from __future__ import annotations

import re
from typing import Any

from agents_stream import SagaDefinition, SagaStep, StepContext
from agents_stream.examples.services import call_service

#: how an order is named in a message ("o-1042"): the order-status chain reads the last one said
ORDER_ID = re.compile(r"\bo-[A-Za-z0-9_-]+\b")


def order_of(ctx: StepContext) -> str:
    """The order a message asks about: its ``context_data["order_id"]`` (a web form's field), else the last order
    id in its text. None found fails the step, and the routed desk escalates the message to the support agent."""
    given = ctx.task.context_data.get("order_id")
    if isinstance(given, str) and given:
        return given
    named = ORDER_ID.findall(ctx.task.instruction)
    if not named:
        raise ValueError("the message names no order (o-...)")
    return named[-1]


async def lookup(ctx: StepContext) -> Any:
    status, data = await call_service("orders.lookup", ctx.key, {"order_id": order_of(ctx)},
                                      (ctx.task.task_id, ctx.fencing_token))
    if status >= 400:
        raise RuntimeError(f"orders.lookup answered {status}: {data}")
    return data["order"]


def say(outputs: dict[str, Any]) -> str:
    """The chain's answer to the customer, from what the order service said."""
    order = outputs["lookup"]
    return f"Your order {order['order_id']} is {order['status']} (amount {order['amount']:.2f})."


ORDER_STATUS = SagaDefinition("order_status", (SagaStep("lookup", lookup),), timeout_s=10.0, result=say)
