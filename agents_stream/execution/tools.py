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
import functools
import inspect
import json
import logging
import os
import re
import time
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from agents_stream.contract.models import TaskPayload
from agents_stream.providers.conversation import ToolSpec

__all__ = [
    "FatalToolError", "Tool", "ToolContext", "ToolError", "agent_tool", "deadline", "error_detail", "result_text",
    "tool",
]

#: how much of a failed call's text the views, events and log lines show (the model and the journal get it all)
ERROR_DETAIL_MAX_CHARS = 500
#: environment variables whose values are secrets: the worker's own (Settings.SECRETS) and, by their names,
#: provider keys, tokens and passwords; a failed call's text shown anywhere carries ``<redacted>`` instead
_SECRET_ENV = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$", re.IGNORECASE)
_SECRET_MIN_CHARS = 8  # shorter values are too likely to be ordinary words


def error_detail(text: str, environ: dict[str, str] | None = None) -> str:
    """A failed tool call's text as views, events and logs show it: every secret of the worker's environment
    (an ``*_API_KEY``, ``*_TOKEN``, ``*_SECRET``, ``*_PASSWORD`` variable's value) replaced by ``<redacted>`` as
    provider errors are (docs/security.md), then at most ERROR_DETAIL_MAX_CHARS characters."""
    env = os.environ if environ is None else environ
    secrets = sorted((v for k, v in env.items() if _SECRET_ENV.search(k) and len(v) >= _SECRET_MIN_CHARS),
                     key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, "<redacted>")
    if len(text) > ERROR_DETAIL_MAX_CHARS:
        text = text[: ERROR_DETAIL_MAX_CHARS - 1] + "…"
    return text


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
    #: the fencing token: the task's dispatch number, higher for each worker that takes the task over. A service
    #: that refuses a token lower than the highest it has seen for the task (docs/security.md, Fencing,
    #: "For service authors") also refuses a worker that was cut off and woke up after its task moved on
    fencing_token: int = 0


@functools.lru_cache(maxsize=1024)
def _spec(name: str, description: str, arguments: type[BaseModel]) -> ToolSpec:
    """A tool's spec, made once: the model is told of every tool at every turn, and pydantic's schema generation
    was 8% of an agent loop's CPU (the providers only read the schema into their request bodies)."""
    schema = arguments.model_json_schema()
    schema.pop("title", None)
    return ToolSpec(name, description, schema)


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
    #: calls in flight at once, cluster-wide (split among live workers, as a provider's); None: no limit
    max_concurrency: int | None = None
    #: overrides of the config's ``[breaker]`` defaults for this tool's breaker (shared by all workers)
    breaker: tuple[tuple[str, Any], ...] = ()
    #: a human approves a call first when this says why (given the validated arguments); True: every call
    approval: Callable[[Any], str | None] | bool | None = None
    #: a rejected call: "tell_model" (it reads "rejected by <who>: <comment>" and goes on) or "fail" (the task fails)
    on_reject: str = "tell_model"
    #: an agent used as a tool: the call is a sub-task of that configured agent (``agent_tool``)
    delegate: str | None = None

    def needs_approval(self, arguments: dict[str, Any]) -> str | None:
        """Why this call waits for a human, or None (arguments that do not validate never reach a human)."""
        if not self.approval:
            return None
        try:
            parsed = self.validate(arguments)
        except ToolError:
            return None
        if self.approval is True:
            return f"tool {self.name}: every call is approved first"
        assert callable(self.approval)
        why = self.approval(parsed)
        return f"tool {self.name}: {why}" if why else None

    @property
    def circuit(self) -> str:
        """The name of this tool's breaker: the function's import path, so two tools of one name stay apart."""
        return f"tool:{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', self.name)}"

    @property
    def spec(self) -> ToolSpec:
        return _spec(self.name, self.description, self.arguments)

    def validate(self, arguments: dict[str, Any]) -> Any:
        """The model's arguments checked (what ``invoke`` and ``approval`` get); ToolError says what is wrong, in
        words the model can act on."""
        try:
            return self.arguments.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(arguments)'}: {e['msg']}" for e in exc.errors())
            raise ToolError(f"invalid arguments for {self.name}: {problems}") from None

    async def invoke(self, ctx: ToolContext, arguments: Any) -> Any:
        """One attempt, bounded by ``timeout_s`` (a synchronous function runs in a thread)."""
        kwargs = {name: getattr(arguments, name) for name in type(arguments).model_fields}
        args = (ctx,) if self.takes_context else ()
        if inspect.iscoroutinefunction(self.fn):
            call: Awaitable[Any] = self.fn(*args, **kwargs)
        else:  # a thread cannot be cancelled: its timeout abandons it (say so in the tool's docs)
            call = asyncio.to_thread(self.fn, *args, **kwargs)
        return await asyncio.wait_for(call, self.timeout_s)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *, name: str | None = None, description: str | None = None, timeout_s: float = 30.0, retries: int = 2,
    max_concurrency: int | None = None, breaker: dict[str, Any] | None = None,
    approval: Callable[[Any], str | None] | bool | None = None, on_reject: str = "tell_model",
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None, /, *, name: str | None = None, description: str | None = None,
    timeout_s: float = 30.0, retries: int = 2, max_concurrency: int | None = None,
    breaker: dict[str, Any] | None = None, approval: Callable[[Any], str | None] | bool | None = None,
    on_reject: str = "tell_model",
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make ``fn`` a Tool: ``@tool`` or ``@tool(timeout_s=..., retries=..., max_concurrency=..., breaker={...},
    approval=lambda args: "why" or None, on_reject="tell_model" | "fail")``.

    Its parameters (after an optional first ``ctx: ToolContext``) become the
    arguments' JSON Schema; every one needs a type hint. The docstring's first
    paragraph is the description the model reads.
    """

    def make(f: Callable[..., Any]) -> Tool:
        made = _build(f, name or f.__name__, description, timeout_s, retries)
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"tool {made.name!r}: max_concurrency must be >= 1")
        if on_reject not in ("tell_model", "fail"):
            raise ValueError(f"tool {made.name!r}: on_reject must be 'tell_model' or 'fail'")
        return replace(made, max_concurrency=max_concurrency, breaker=tuple(sorted((breaker or {}).items())),
                       approval=approval, on_reject=on_reject)

    return make(fn) if fn is not None else make


def agent_tool(agent: str, description: str, *, name: str | None = None) -> Tool:
    """Another configured agent as a tool: a call publishes a sub-task (``<task_id>/<call_id>``) to that agent's
    topic and parks the caller until its result comes back (any worker of any app id may run it); the model reads
    the sub-task's output as the call's result."""

    async def delegated(instruction: str, context: dict[str, Any] | None = None) -> Any:
        raise RuntimeError(f"the agent tool {agent!r} runs as a sub-task, never as a function")

    if not re.match(r"^[A-Za-z0-9_-]+$", agent):
        raise ValueError(f"agent_tool {agent!r}: an agent name is letters, digits, - or _")
    made = _build(delegated, name or agent, description, 30.0, 0)
    return replace(made, delegate=agent)


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
