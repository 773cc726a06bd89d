"""The support refund saga: label → refund (pivot) → notify → update order.

Runs against the services at ``AGENTS_STREAM_REFUND_SERVICES`` (the fake ones
in ``agents_stream.examples.services`` for tests and demos). Configure an
agent with ``saga = "agents_stream.examples.refund:REFUND"``; its tasks carry
the order in ``context_data`` (``order_id``, ``amount``, ``email``).
"""

from __future__ import annotations

from typing import Any

from agents_stream import SagaDefinition, SagaStep, StepContext
from agents_stream.examples.services import call_service


async def _call(operation: str, ctx: StepContext, body: dict[str, Any]) -> Any:
    status, data = await call_service(operation, ctx.key, body, (ctx.task.task_id, ctx.fencing_token))
    if status >= 400:
        raise RuntimeError(f"{operation} answered {status}: {data}")
    return data


def _order(ctx: StepContext) -> dict[str, Any]:
    return {k: ctx.task.context_data.get(k) for k in ("order_id", "amount", "email")}


async def create_label(ctx: StepContext) -> Any:
    return await _call("carrier.label", ctx, _order(ctx))


async def cancel_label(ctx: StepContext) -> Any:
    return await _call("carrier.cancel_label", ctx, {**_order(ctx), "label": ctx.outputs.get("label")})


async def refund(ctx: StepContext) -> Any:
    return await _call("payment.refund", ctx, _order(ctx))


async def notify(ctx: StepContext) -> Any:
    return await _call("mail.send", ctx, {**_order(ctx), "template": "refund_issued"})


async def update_order(ctx: StepContext) -> Any:
    return await _call("orders.update", ctx, {**_order(ctx), "status": "refunded"})


REFUND = SagaDefinition(
    "refund",
    (
        SagaStep("label", create_label, cancel_label),
        # money moves: a human signs off when the agent has a policy
        SagaStep("refund", refund, pivot=True, approval=True),
        SagaStep("notify", notify),
        SagaStep("update_order", update_order),
    ),
    timeout_s=15.0,
)
