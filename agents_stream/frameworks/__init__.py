"""Agents written with a framework (Pydantic AI, the OpenAI Agents SDK), run unchanged and durably.

The config names the framework's own agent object (``agent = "module:NAME"``);
``adapt`` recognises which framework made it and wraps it in that framework's
adapter, whose model requests and tool calls are entries of the task's journal
(``durable.py``). Importing this package imports no framework: an adapter module
is imported only when an agent of its framework is loaded.

A tool of such an agent passes ``idempotency_key()`` (or ``idempotency_headers()``
on its HTTP request) to the service it calls, so a call run again after a crash
has no second effect.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.named import load_object
from agents_stream.frameworks.durable import (
    CallContext,
    DurableRun,
    call_context,
    idempotency_headers,
    idempotency_key,
)

__all__ = [
    "ADAPTERS", "CallContext", "DurableRun", "FrameworkAgent", "adapt", "call_context", "idempotency_headers",
    "idempotency_key", "load_acting",
]

#: the top-level package of a framework's agent class → the adapter module that runs such agents (its ``adapt``)
ADAPTERS = {
    "pydantic_ai": "agents_stream.frameworks.pydantic_ai_adapter",
    "agents": "agents_stream.frameworks.openai_agents_adapter",
}


class FrameworkAgent(Protocol):
    """A framework's agent as the executor runs it: each task one ``run`` over the task's journal."""

    #: the adapter's name, marked on every journal entry ("pydantic_ai", "openai_agents")
    framework: str
    #: the framework agent's own name (for log lines)
    name: str
    #: a fingerprint of what the agent is (instructions, tools, framework version), journaled with each turn
    version: str

    async def run(self, prompt: str, durable: DurableRun) -> Any:
        """Run the agent on ``prompt`` with its model requests and tool calls going through ``durable``; the final
        output as JSON (a str, or a model dumped to JSON)."""
        ...

    def unavailable(self, exc: BaseException) -> str | None:
        """Why the model cannot be reached for now (a connection error, a 5xx or 429 after the client's retries):
        the task is held and tried again; None: the error ends the task."""
        ...


def adapt(obj: Any) -> FrameworkAgent | None:
    """``obj`` wrapped in its framework's adapter; None when no adapter knows its type. ValueError when the
    framework is recognised but cannot be run (its optional extra is not installed, or not the object expected)."""
    package = type(obj).__module__.split(".")[0]
    module_name = ADAPTERS.get(package)
    if module_name is None:
        return None
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"a {package} agent needs agents-stream's frameworks extra: pip install "
                         f"'agents-stream[frameworks]' ({exc})") from None
    adapted: FrameworkAgent | None = module.adapt(obj)
    return adapted


def load_acting(path: str) -> Agent | FrameworkAgent:
    """What ``agent = "package.module:NAME"`` names: an agents_stream Agent, or a framework's agent in its adapter;
    ValueError saying what is wrong (what the object is, when no adapter knows it)."""
    obj = load_object(path, "agent")
    if isinstance(obj, Agent):
        return obj
    adapted = adapt(obj)
    if adapted is None:
        raise ValueError(f"agent {path!r} is not an agents_stream Agent, a pydantic_ai Agent or an OpenAI Agents SDK "
                         f"agents.Agent (it is a {type(obj).__module__}.{type(obj).__qualname__})")
    return adapted
