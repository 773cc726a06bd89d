"""agents-stream: LLM agent work as a stateful Faust stream topology on Kafka.

The front door: everything a user writes agents, tools, sagas and routes with, and the conversations client.

    from agents_stream import Agent, ToolContext, tool

    @tool
    async def lookup_order(ctx: ToolContext, order_id: str) -> dict:
        \"\"\"Look an order up.\"\"\"
        ...

    SUPPORT = Agent("support", instructions="...", tools=[lookup_order])

Test an agent without a broker with ``agents_stream.testing`` (``run_agent``, ``ScriptedModel``, ``replay``).

The names load lazily (PEP 562): ``import agents_stream`` costs nothing, and an agent's module pulls in only what
defining an agent needs (pydantic and the provider clients' HTTP library, about 0.3 s), never Faust or Kafka, which
only a worker loads. Type checkers read the imports below as they are.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from agents_stream.client import Client, ClientError
    from agents_stream.config import McpServerConfig
    from agents_stream.contract.errors import TransientError
    from agents_stream.execution.agent_definitions import Agent
    from agents_stream.execution.handoff_tool import handoff
    from agents_stream.execution.routing_definitions import RouteMessage, Routing, Rule
    from agents_stream.execution.saga_definitions import SagaDefinition, SagaStep, StepContext
    from agents_stream.execution.tools import FatalToolError, Tool, ToolContext, ToolError, agent_tool, tool

#: each public name → the module that defines it
_HOMES = {
    "Agent": "agents_stream.execution.agent_definitions",
    "Client": "agents_stream.client",
    "ClientError": "agents_stream.client",
    "FatalToolError": "agents_stream.execution.tools",
    "McpServerConfig": "agents_stream.config",
    "RouteMessage": "agents_stream.execution.routing_definitions",
    "Routing": "agents_stream.execution.routing_definitions",
    "Rule": "agents_stream.execution.routing_definitions",
    "SagaDefinition": "agents_stream.execution.saga_definitions",
    "SagaStep": "agents_stream.execution.saga_definitions",
    "StepContext": "agents_stream.execution.saga_definitions",
    "Tool": "agents_stream.execution.tools",
    "ToolContext": "agents_stream.execution.tools",
    "ToolError": "agents_stream.execution.tools",
    "TransientError": "agents_stream.contract.errors",
    "agent_tool": "agents_stream.execution.tools",
    "handoff": "agents_stream.execution.handoff_tool",
    "tool": "agents_stream.execution.tools",
}

__all__ = [
    "Agent", "Client", "ClientError", "FatalToolError", "McpServerConfig", "RouteMessage", "Routing", "Rule",
    "SagaDefinition", "SagaStep", "StepContext", "Tool", "ToolContext", "ToolError", "TransientError", "__version__",
    "agent_tool", "handoff", "tool",
]

if not TYPE_CHECKING:  # hidden from type checkers: a misspelt name stays an error there, not Any

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module 'agents_stream' has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # the next access is a plain lookup
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
