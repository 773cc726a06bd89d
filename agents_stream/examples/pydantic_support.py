"""A support agent written with Pydantic AI, nothing of agents-stream in it but the idempotency key its tools send.

    agent = "agents_stream.examples.pydantic_support:SUPPORT"

It is an ordinary ``pydantic_ai.Agent`` with its own OpenAI-compatible model
client (``AGENTS_STREAM_EXAMPLE_LLM``: the API's base URL, ending ``/v1``; the
fake LLM's by default) and two tools that call the example services at
``AGENTS_STREAM_REFUND_SERVICES``: look the order up, refund it. Run by
agents-stream (docs/guide/pydantic-ai.md), each model request and each tool call
is journaled; a tool sends ``idempotency_headers()`` (the call's key, the same on
every worker that runs it, and the fencing token) so a refund run again after a
crash is not applied twice.
"""

from __future__ import annotations

import os
from typing import Any

import aiohttp
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from agents_stream.frameworks import idempotency_headers

#: the OpenAI-compatible API the agent's own client calls (``agents-stream fake-llm --port 8089`` by default)
LLM_URL = os.environ.get("AGENTS_STREAM_EXAMPLE_LLM", "http://127.0.0.1:8089/v1")

MODEL = OpenAIChatModel(
    os.environ.get("AGENTS_STREAM_EXAMPLE_MODEL", "fake-model"),
    # the fake LLM takes any key; a real endpoint reads OPENAI_API_KEY from the worker's environment
    provider=OpenAIProvider(base_url=LLM_URL, api_key=os.environ.get("OPENAI_API_KEY", "not-needed-by-the-fake")),
)

SUPPORT = Agent(
    MODEL,
    name="pydantic_support",
    instructions=(
        "You resolve customer refund requests. Look the order up before you act; refund at most the order's "
        "amount. Answer with one sentence saying what was done."
    ),
)


async def _service(operation: str, body: dict[str, Any]) -> Any:
    """POST ``operation`` to the example services with this call's idempotency key and fencing token."""
    base = os.environ.get("AGENTS_STREAM_REFUND_SERVICES", "http://127.0.0.1:8090").rstrip("/")
    service, op = operation.split(".")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        async with session.post(f"{base}/{service}/{op}", json=body, headers=idempotency_headers()) as resp:
            answer = await resp.json(content_type=None)
            if resp.status >= 400:  # nothing happened at the service: the model hears why and may try again
                raise ModelRetry(f"{operation} answered {resp.status}: {answer}")
            return answer


@SUPPORT.tool_plain
async def lookup_order(order_id: str) -> Any:
    """Look an order up: its amount, the customer's email and its delivery status."""
    return (await _service("orders.lookup", {"order_id": order_id}))["order"]


@SUPPORT.tool_plain
async def refund(order_id: str, amount: float) -> Any:
    """Refund ``amount`` of an order to the customer's card. Moves money: call it once per order."""
    answer = await _service("payment.refund", {"order_id": order_id, "amount": amount})
    return {"refund_id": answer["id"], "order_id": order_id, "amount": amount}
