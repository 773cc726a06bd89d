"""The support agent of the refund conversation written with the OpenAI Agents SDK, unchanged: look the order up,
create a return label, refund, notify.

A plain ``agents.Agent`` with its own model client (the SDK's Chat Completions
model on an ``AsyncOpenAI`` client: ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``,
by default the fake LLM of ``agents-stream fake-llm``). Nothing here knows
agents-stream but the tools' one line that hands the call's idempotency key
(and fencing token) to the service: configure an agent with
``agent = "agents_stream.examples.openai_agents_support:SUPPORT"`` and every
model response and tool call is journaled, so a task resumed after a crash asks
no journaled response again and refunds once (docs/guide/openai-agents.md).
The services are the fake ones of ``agents_stream.examples.services`` at
``AGENTS_STREAM_REFUND_SERVICES``.
"""

from __future__ import annotations

import os
from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, function_tool
from openai import AsyncOpenAI

from agents_stream.examples.services import call_service
from agents_stream.frameworks import call_context


async def _service(operation: str, body: dict[str, Any]) -> Any:
    """``operation`` with the running call's idempotency key and fencing token; a refusal raises, and the SDK tells
    the model what went wrong."""
    call = call_context()
    status, data = await call_service(operation, call.key, body, (call.task_id, call.fencing_token))
    if status >= 400:
        raise RuntimeError(f"{operation} answered {status}: {data}")
    return data


@function_tool
async def lookup_order(order_id: str) -> Any:
    """Look an order up: its amount, the customer's email and its delivery status."""
    return (await _service("orders.lookup", {"order_id": order_id}))["order"]


@function_tool
async def create_label(order_id: str) -> Any:
    """Create a return shipping label for an order."""
    return await _service("carrier.label", {"order_id": order_id})


@function_tool
async def refund(order_id: str, amount: float) -> Any:
    """Refund ``amount`` of an order to the customer's card. Moves money: call it once per order."""
    return await _service("payment.refund", {"order_id": order_id, "amount": amount})


@function_tool
async def notify_customer(email: str, text: str) -> Any:
    """Write to the customer."""
    return await _service("mail.send", {"email": email, "text": text})


MODEL = OpenAIChatCompletionsModel(
    model=os.environ.get("OPENAI_MODEL", "fake-model"),
    openai_client=AsyncOpenAI(
        base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8089/v1"),
        api_key=os.environ.get("OPENAI_API_KEY", "fake-key"),
    ),
)

SUPPORT = Agent(
    name="support",
    instructions=(
        "You resolve customer support requests. Look the order up before you act; refund at most the order's "
        "amount; tell the customer what you did. Answer with one sentence saying what was done."
    ),
    tools=[lookup_order, create_label, refund, notify_customer],
    model=MODEL,
)
