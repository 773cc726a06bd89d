"""A pydantic_ai Agent, unchanged, run durably: each model request and each tool call one journal entry.

Pydantic AI's own durable integrations (Temporal, DBOS, Prefect) make every model
request and every tool call one durable unit; this adapter does the same through
the agent's public extension point, a per-run capability (``Journaled``): its
``wrap_model_request`` answers a request from the journal or asks the agent's own
model (its own client, its own retries) and journals the response before the
agent sees it; its ``wrap_tool_execute`` answers a call from the journal or runs
the tool with the call's idempotency key set (``agents_stream.frameworks.
idempotency_key()``) and journals the result. The agent object is not changed:
the capability is passed to this run only (``agent.run(..., capabilities=[...])``).

Responses are journaled as Pydantic AI serializes its messages
(``ModelMessagesTypeAdapter``); a tool's result as JSON (``to_jsonable_python``):
a replay hands a model object back as the dict it was journaled as. A tool that
asks the model to try again (``ModelRetry``) is journaled as such and raises the
same on replay.
"""

from __future__ import annotations

import hashlib
import json
from importlib.metadata import version as package_version
from typing import Any

from pydantic_ai import Agent, ModelMessagesTypeAdapter, ModelRetry, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import (
    ModelConnectionError,
    ModelHTTPError,
    ModelRateLimitError,
    ModelServerError,
    ModelUnavailableError,
    ToolRetryError,
)
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.tools import ToolDefinition
from pydantic_core import to_jsonable_python

from agents_stream.frameworks.durable import DurableRun, ModelTurn, ToolOutcome

__all__ = ["FRAMEWORK", "Journaled", "PydanticAIAgent", "adapt"]

FRAMEWORK = "pydantic_ai"
#: how a tool's ModelRetry is journaled: its message under this key
_RETRY = "__model_retry__"


def adapt(obj: Any) -> PydanticAIAgent | None:
    """A pydantic_ai Agent in its adapter; None for anything else of the package."""
    return PydanticAIAgent(obj) if isinstance(obj, Agent) else None


class PydanticAIAgent:
    """A pydantic_ai ``Agent`` as the executor runs it (agents_stream.frameworks.FrameworkAgent)."""

    framework = FRAMEWORK

    def __init__(self, agent: Agent[Any, Any]) -> None:
        self.agent = agent
        self.name = agent.name or "agent"
        self.version = _fingerprint(agent)

    async def run(self, prompt: str, durable: DurableRun) -> Any:
        result = await self.agent.run(prompt, capabilities=[Journaled(durable)])
        return to_jsonable_python(result.output)

    def unavailable(self, exc: BaseException) -> str | None:
        """A rate limit, an outage, a server error or no answer at all (after the client's own retries): held; a
        refusal of the request (a bad key, an unknown model, too long a context) ends the task."""
        transient = isinstance(exc, (ModelRateLimitError, ModelUnavailableError, ModelServerError,
                                     ModelConnectionError))
        if isinstance(exc, ModelHTTPError):
            transient = transient or exc.status_code >= 500 or exc.status_code == 429
        return f"{type(exc).__name__}: {str(exc)[:200]}" if transient else None


class Journaled(AbstractCapability[Any]):
    """One run's model requests and tool calls through the task's journal (``DurableRun``)."""

    def __init__(self, durable: DurableRun) -> None:
        super().__init__()
        self.durable = durable

    async def wrap_model_request(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, handler: Any,
    ) -> ModelResponse:
        async def ask() -> ModelTurn:
            response: ModelResponse = await handler(request_context)
            return _turn(response)

        journaled = await self.durable.model_request(ask, asked=_shape(request_context))
        return ModelMessagesTypeAdapter.validate_python([journaled])[0]  # type: ignore[return-value]

    async def wrap_tool_execute(
        self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition, args: Any, handler: Any,
    ) -> Any:
        raised: list[ToolRetryError] = []

        async def run() -> ToolOutcome:
            try:
                result = await handler(args)
            except ToolRetryError as retry:  # the tool's ModelRetry, already counted against its retries
                raised.append(retry)
                cause = retry.__cause__
                return ToolOutcome({_RETRY: cause.message if isinstance(cause, ModelRetry) else str(retry)}, error=True)
            return ToolOutcome(_jsonable(result))

        result = await self.durable.tool_call(call.tool_call_id, call.tool_name, call.args_as_dict(), run)
        if raised:
            raise raised[0]
        if isinstance(result, dict) and set(result) == {_RETRY}:
            raise ModelRetry(result[_RETRY])  # told again, and counted again, as when the tool raised it
        return result


def _turn(response: ModelResponse) -> ModelTurn:
    calls = tuple({"id": p.tool_call_id, "name": p.tool_name, "arguments": p.args_as_dict()}
                  for p in response.parts if isinstance(p, ToolCallPart))
    text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
    serialized = ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]
    return ModelTurn(response=serialized, text=text, calls=calls, source=f"{FRAMEWORK}:{response.model_name}",
                     input_tokens=response.usage.input_tokens, output_tokens=response.usage.output_tokens)


def _shape(request_context: ModelRequestContext) -> str:
    """What a request is made of, without its text (timestamps and dynamic instructions change on a replay): the
    kinds of its messages' parts and the tool calls they answer, and the tools it offers."""
    parts = []
    for message in request_context.messages:
        if isinstance(message, ModelRequest):
            parts += [f"{p.part_kind}:{getattr(p, 'tool_name', '')}:{getattr(p, 'tool_call_id', '')}".rstrip(":")
                      for p in message.parts if p.part_kind != "system-prompt"]
        else:
            parts.append("response")
    params = request_context.model_request_parameters
    tools = sorted(t.name for t in [*params.function_tools, *params.output_tools])
    digest = hashlib.sha256(json.dumps([parts, tools]).encode()).hexdigest()[:12]
    return f"{len(parts)} parts, tools {','.join(tools)}, {digest}"


def _jsonable(result: Any) -> Any:
    try:
        return to_jsonable_python(result)
    except Exception:  # a result pydantic cannot serialize: its text is what the model would read anyway
        return str(result)


def _fingerprint(agent: Agent[Any, Any]) -> str:
    """The framework's version and a hash of the agent's tools (names, descriptions, schemas)."""
    tools = []
    for toolset in agent.toolsets:
        for name, tool in sorted(getattr(toolset, "tools", {}).items()):
            definition = getattr(tool, "tool_def", None)
            tools.append([name, getattr(definition, "description", None),
                          getattr(definition, "parameters_json_schema", None)])
    digest = hashlib.sha256(json.dumps(tools, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"pydantic-ai {package_version('pydantic-ai-slim')}+{digest}"
