"""A billing agent that moves money once: it looks an account up, then charges it.

``charge`` calls the payment service with the call's idempotency key (``<task_id>:<turn>:<call_id>``), so a call
repeated after a crash has no second effect; a second *decision* to charge (a new call id) is stopped only by the
worker's ownership of the task, which is what the partition tests (tests/integration/test_partitions.py) prove.
Its tools are its own functions, so their breakers (``tool:agents_stream.examples.billing.*``, shared by every
worker) are not the support agent's. Configure an agent with ``agent = "agents_stream.examples.billing:BILLING"``.
"""

from __future__ import annotations

from typing import Any

from agents_stream.contract.errors import TransientError
from agents_stream.examples.services import call_service
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.tools import ToolContext, ToolError, tool


async def _call(operation: str, ctx: ToolContext, body: dict[str, Any]) -> Any:
    status, data = await call_service(operation, ctx.key, body)
    if status >= 500 or status == 429:
        raise TransientError(f"{operation} answered {status}")  # retried with the same key
    if status >= 400:
        raise ToolError(f"{operation} refused: {data}")  # the model hears why
    return data


@tool
async def lookup_account(ctx: ToolContext, account: str) -> Any:
    """Look an account up: what it owes."""
    return (await _call("accounts.lookup", ctx, {"account": account}))["account"]


@tool(timeout_s=15)
async def charge(ctx: ToolContext, account: str, amount: float) -> Any:
    """Charge ``amount`` to an account's card. Moves money: call it once per account."""
    return await _call("payment.charge", ctx, {"account": account, "amount": amount})


BILLING = Agent(
    "billing",
    instructions="You collect what an account owes. Look the account up, charge it what it owes, say what you did.",
    tools=[lookup_account, charge],
    max_turns=6,
)
