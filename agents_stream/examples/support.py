"""The support agent of the refund conversation, as a tool-calling loop: look the order up, create a return label,
refund, notify.

The model decides which tool to call next; every call goes to the services at
``AGENTS_STREAM_REFUND_SERVICES`` (the fake ones of ``agents_stream.examples.services``
for tests and demos) with the call's idempotency key, so a call repeated after a
crash has no second effect. Configure an agent with
``agent = "agents_stream.examples.support:SUPPORT"`` and approval levels (a refund
above ``REFUND_APPROVAL_ABOVE`` waits for a human at that call).
"""

from __future__ import annotations

from typing import Any

from agents_stream import Agent, ToolContext, tool
from agents_stream.examples.services import tool_call


@tool
async def lookup_order(ctx: ToolContext, order_id: str) -> Any:
    """Look an order up: its amount, the customer's email and its delivery status."""
    return (await tool_call("orders.lookup", ctx, {"order_id": order_id}))["order"]


@tool
async def create_label(ctx: ToolContext, order_id: str) -> Any:
    """Create a return shipping label for an order."""
    return await tool_call("carrier.label", ctx, {"order_id": order_id})


#: refunds above this many (currency units) wait for a human (the agent's approval levels in the config)
REFUND_APPROVAL_ABOVE = 100.0


def _large(arguments: Any) -> str | None:
    if arguments.amount > REFUND_APPROVAL_ABOVE:
        return f"amount {arguments.amount:g} > {REFUND_APPROVAL_ABOVE:g}"
    return None


@tool(timeout_s=15, approval=_large)
async def refund(ctx: ToolContext, order_id: str, amount: float) -> Any:
    """Refund ``amount`` of an order to the customer's card. Moves money: call it once per order."""
    return await tool_call("payment.refund", ctx, {"order_id": order_id, "amount": amount})


@tool
async def notify_customer(ctx: ToolContext, email: str, text: str) -> Any:
    """Write to the customer."""
    return await tool_call("mail.send", ctx, {"email": email, "text": text})


SUPPORT = Agent(
    "support",
    instructions=(
        "You resolve customer support requests. Look the order up before you act; refund at most the order's "
        "amount; tell the customer what you did. Answer with one sentence saying what was done."
    ),
    tools=[lookup_order, create_label, refund, notify_customer],
    max_turns=8,
)
