"""Tools an agent's model may call: ``@tool`` builds each one's JSON Schema from its type hints and docstring.

    @tool(timeout_s=10, retries=2)
    async def refund(ctx: ToolContext, order_id: str, amount: float) -> dict:
        \"\"\"Refund ``amount`` of an order to the customer.\"\"\"
        return await payments.refund(order_id, amount, idempotency_key=ctx.key)

The model's arguments are validated (pydantic) before the function runs; a
mistake goes back to the model as the call's result. ``ctx.key`` is the call's
idempotency key (``<task_id>:<turn>:<call_id>``): the same on every attempt and
on every worker that runs the call after a crash, so a service that honours it
applies the call once. Raise ``ToolError`` to tell the model the call failed,
``FatalToolError`` to end the task; a ``TransientError`` (or a timeout or a
connection error) is retried with backoff first.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from agents_stream.contract.models import TaskPayload
from agents_stream.providers.conversation import ToolSpec

__all__ = ["FatalToolError", "Tool", "ToolContext", "ToolError", "deadline", "result_text", "tool"]


class ToolError(Exception):
    """The call failed in a way the model should hear about (its message is the call's result)."""


class FatalToolError(Exception):
    """The call failed in a way that ends the task (a failed result and a dead letter)."""


@dataclass(frozen=True)
class ToolContext:
    """What a tool gets besides the model's arguments."""

    task: TaskPayload
    turn: int
    call_id: str
    #: the idempotency key to hand to the service the tool calls: the same on every attempt, on every worker
    key: str
    attempt: int
    #: the epoch time (time.time()) this attempt is cancelled at
    deadline: float
    log: logging.LoggerAdapter[logging.Logger]


@dataclass(frozen=True)
class Tool:
    """A function the model may call, with its arguments' model and its policy."""

    name: str
    description: str
    fn: Callable[..., Any]
    arguments: type[BaseModel]
    #: the function's first parameter is the ToolContext
    takes_context: bool
    #: bound of one attempt
    timeout_s: float = 30.0
    #: attempts after the first on a transient error (TransientError, a timeout, a connection error)
    retries: int = 2

    @property
    def spec(self) -> ToolSpec:
        schema = self.arguments.model_json_schema()
        schema.pop("title", None)
        return ToolSpec(self.name, self.description, schema)

    def validate(self, arguments: dict[str, Any]) -> BaseModel:
        """The model's arguments checked; ToolError says what is wrong, in words the model can act on."""
        try:
            return self.arguments.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(arguments)'}: {e['msg']}" for e in exc.errors())
            raise ToolError(f"invalid arguments for {self.name}: {problems}") from None

    async def invoke(self, ctx: ToolContext, arguments: BaseModel) -> Any:
        """One attempt, bounded by ``timeout_s`` (a synchronous function runs in a thread)."""
        kwargs = {name: getattr(arguments, name) for name in type(arguments).model_fields}
        args = (ctx,) if self.takes_context else ()
        if inspect.iscoroutinefunction(self.fn):
            call: Awaitable[Any] = self.fn(*args, **kwargs)
        else:  # a thread cannot be cancelled: its timeout abandons it (say so in the tool's docs)
            call = asyncio.to_thread(self.fn, *args, **kwargs)
        return await asyncio.wait_for(call, self.timeout_s)


def tool(
    fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None,
    timeout_s: float = 30.0, retries: int = 2,
) -> Any:
    """Make ``fn`` a Tool: ``@tool`` or ``@tool(timeout_s=..., retries=...)``.

    Its parameters (after an optional first ``ctx: ToolContext``) become the
    arguments' JSON Schema; every one needs a type hint. The docstring's first
    paragraph is the description the model reads.
    """

    def make(f: Callable[..., Any]) -> Tool:
        return _build(f, name or f.__name__, description, timeout_s, retries)

    return make(fn) if fn is not None else make


def _build(fn: Callable[..., Any], name: str, description: str | None, timeout_s: float, retries: int) -> Tool:
    if timeout_s <= 0 or retries < 0:
        raise ValueError(f"tool {name!r}: timeout_s must be > 0 and retries >= 0")
    hints = get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())
    takes_context = bool(params) and hints.get(params[0].name) is ToolContext
    fields: dict[str, Any] = {}
    for p in params[1:] if takes_context else params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ValueError(f"tool {name!r}: *args and **kwargs cannot be described to a model")
        if p.name not in hints:
            raise ValueError(f"tool {name!r}: parameter {p.name!r} needs a type hint (it becomes the JSON Schema)")
        default = ... if p.default is p.empty else p.default
        fields[p.name] = (hints[p.name], default)
    model = create_model(
        f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields,
    )
    text = description if description is not None else (inspect.getdoc(fn) or "").split("\n\n")[0].strip()
    return Tool(name, text or name, fn, model, takes_context, timeout_s, retries)


def result_text(value: Any) -> str:
    """A tool's return value as the text the model reads: a string as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def deadline(timeout_s: float) -> float:
    return time.time() + timeout_s
