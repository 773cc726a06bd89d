"""A billing agent that moves money once: it looks an account up, then charges it.

``charge`` calls the payment service with the call's idempotency key (``<task_id>:<turn>:<call_id>``), so a call
repeated after a crash has no second effect; a second *decision* to charge (a new call id) is stopped only by the
worker's ownership of the task, which is what the partition tests (tests/integration/test_partitions.py) prove.
Its tools are its own functions, so their breakers (``tool:agents_stream.examples.billing.*``, shared by every
worker) are not the support agent's. Configure an agent with ``agent = "agents_stream.examples.billing:BILLING"``.
"""

from __future__ import annotations

from typing import Any

from agents_stream import Agent, ToolContext, tool
from agents_stream.examples.services import tool_call


@tool
async def lookup_account(ctx: ToolContext, account: str) -> Any:
    """Look an account up: what it owes."""
    return (await tool_call("accounts.lookup", ctx, {"account": account}))["account"]


@tool(timeout_s=15)
async def charge(ctx: ToolContext, account: str, amount: float) -> Any:
    """Charge ``amount`` to an account's card. Moves money: call it once per account."""
    return await tool_call("payment.charge", ctx, {"account": account, "amount": amount})


BILLING = Agent(
    "billing",
    instructions="You collect what an account owes. Look the account up, charge it what it owes, say what you did.",
    tools=[lookup_account, charge],
    max_turns=6,
)
