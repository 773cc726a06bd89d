"""The OpenAI Agents SDK's ``agents.Agent``, run unchanged and durably: each model response and each function-tool
call is an entry of the task's journal.

The shape of the SDK's own durable integrations (a model whose every response is
one durable step, tools whose every call is one): at load, the agent and every
agent it hands off to are cloned with their model wrapped (``_JournaledModel``)
and their function tools wrapped (``_journaled_tool``); the user's objects are
not changed. Each task is one ``Runner.run`` of the clone on the task's prompt.
The SDK's loop is deterministic given its model responses and tool results, so
the n-th response it asks for is turn n of the journal (``DurableRun``): a
journaled response is handed back as it was (``ModelResponse`` as JSON, no HTTP
request), a journaled tool result is returned without running the tool, and
what is not journaled yet is asked or run, journaled durably, then handed over.
A tool reads its call's idempotency key with ``agents_stream.frameworks.
idempotency_key()`` (or sends ``idempotency_headers()``).

What runs outside the journal is refused at load rather than run twice after a
crash unnoticed: tools the worker would run itself that are not function tools
(computer, shell, apply-patch, custom tools) and MCP servers. Hosted tools (web
search, file search, code interpreter, hosted MCP) run at the model provider:
their results arrive inside the journaled response. A handoff is a response's
call like any other; its ``on_handoff`` callback runs again on a replay, so it
must have no effect of its own (docs/guide/openai-agents.md).
"""

from __future__ import annotations

import copy
import hashlib
import json
from contextvars import ContextVar
from typing import Any

import agents
import openai
from agents import Agent, FunctionTool, Handoff, ModelResponse, RunConfig, Runner
from agents.models.interface import Model
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from agents_stream.frameworks.durable import DurableRun, ModelTurn, ToolOutcome

__all__ = ["FRAMEWORK", "OpenAIAgentsAgent", "adapt"]

#: the adapter's name, marked on every journal entry it writes
FRAMEWORK = "openai_agents"

#: the SDK's ``Runner.run`` default, kept when the adapter runs it
MAX_TURNS = 10

#: tools the model provider runs (their results are part of the journaled response)
_HOSTED = (agents.WebSearchTool, agents.FileSearchTool, agents.CodeInterpreterTool, agents.HostedMCPTool,
           agents.ImageGenerationTool, agents.ToolSearchTool)

#: a ModelResponse as JSON and back (the SDK's items are pydantic models; aliases keep fields like ``async``)
_RESPONSE: TypeAdapter[ModelResponse] = TypeAdapter(ModelResponse)

#: the run of the task running now (the wrapped agent is built once; each task's run is its own)
_RUN: ContextVar[DurableRun | None] = ContextVar("agents_stream_openai_agents_run", default=None)


def adapt(obj: Any) -> OpenAIAgentsAgent | None:
    """``obj`` in this adapter when it is an ``agents.Agent``; None otherwise. ValueError when it cannot run
    durably (a tool or an MCP server that would run outside the journal)."""
    return OpenAIAgentsAgent(obj) if isinstance(obj, Agent) else None


class OpenAIAgentsAgent:
    """An ``agents.Agent`` as the executor runs it (the ``FrameworkAgent`` of agents_stream.frameworks)."""

    framework = FRAMEWORK

    def __init__(self, agent: Agent[Any], *, max_turns: int = MAX_TURNS) -> None:
        self.agent = agent
        self.name = agent.name
        self.max_turns = max_turns
        self._clones: dict[int, Agent[Any]] = {}
        self._shown: dict[str, Any] = {}
        self.durable_agent = self._clone(agent)
        canonical = json.dumps({"sdk": agents.__version__, "agents": self._shown}, sort_keys=True, default=str)
        self.version = hashlib.sha256(canonical.encode()).hexdigest()[:12]

    async def run(self, prompt: str, durable: DurableRun) -> Any:
        """One ``Runner.run`` of the wrapped agent on ``prompt`` over ``durable``'s journal: its final output as
        JSON. The SDK's tracing is off for it (its default exporter would send each run to OpenAI)."""
        token = _RUN.set(durable)
        try:  # what it raises the runner reads (a fence or a mismatch, however the SDK wraps it)
            result = await Runner.run(self.durable_agent, prompt, max_turns=self.max_turns,
                                      run_config=RunConfig(tracing_disabled=True))
        finally:
            _RUN.reset(token)
        return to_jsonable_python(result.final_output)

    def unavailable(self, exc: BaseException) -> str | None:
        """Why the agent's model cannot be reached now, after its client's own retries: no connection, a timeout,
        a 429 or a 5xx (the task is held and tried again from its journal); None: the error ends the task."""
        cause = _model_error(exc)
        if isinstance(cause, (openai.APIConnectionError, openai.APITimeoutError)):
            return f"{type(cause).__name__}: {cause}"
        if isinstance(cause, openai.APIStatusError) and (cause.status_code == 429 or cause.status_code >= 500):
            return f"the model answered HTTP {cause.status_code}"
        return None

    def _clone(self, agent: Agent[Any]) -> Agent[Any]:
        """``agent`` with its model and function tools journaled, and its handoffs' agents too (once each)."""
        done = self._clones.get(id(agent))
        if done is not None:
            return done
        problems = [p for p in map(_refused, agent.tools) if p is not None]
        if agent.mcp_servers:
            problems.append(f"{len(agent.mcp_servers)} MCP server(s) (their tools are listed and called outside "
                            "the journal; wrap each tool you need as a function tool)")
        if problems:
            raise ValueError(f"OpenAI Agents SDK agent {agent.name!r} cannot run durably: {'; '.join(problems)}")
        handoff_names = [h.tool_name if isinstance(h, Handoff) else f"agent:{h.name}" for h in agent.handoffs]
        tool_names = sorted(t.name for t in agent.tools)
        asked = f"{agent.name}: tools {','.join(tool_names) or '-'}; handoffs {','.join(sorted(handoff_names)) or '-'}"
        clone = agent.clone(model=_JournaledModel(agent.model, asked),
                            tools=[_journaled_tool(t) if isinstance(t, FunctionTool) else t for t in agent.tools],
                            handoffs=[])
        self._clones[id(agent)] = clone
        self._shown[agent.name] = _shown(agent, handoff_names)
        clone.handoffs = [self._handoff(h) for h in agent.handoffs]
        return clone

    def _handoff(self, handoff: Agent[Any] | Handoff[Any, Any]) -> Agent[Any] | Handoff[Any, Any]:
        if isinstance(handoff, Agent):
            return self._clone(handoff)
        wrapped = copy.copy(handoff)
        invoke = handoff.on_invoke_handoff

        async def on_invoke_handoff(ctx: Any, arguments: str) -> Agent[Any]:
            return self._clone(await invoke(ctx, arguments))

        wrapped.on_invoke_handoff = on_invoke_handoff
        return wrapped


class _JournaledModel(Model):
    """The agent's model, each ``get_response`` the next turn of the journal (asked only when not journaled)."""

    def __init__(self, model: str | Model | None, asked: str) -> None:
        self._model = model
        self._inner: Model | None = model if isinstance(model, Model) else None
        self._asked = asked

    def _resolved(self) -> Model:
        if self._inner is None:  # a model named by a string: the SDK's default provider (OPENAI_* from the env)
            self._inner = agents.MultiProvider().get_model(self._model if isinstance(self._model, str) else None)
        return self._inner

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        durable = _current()
        inner = self._resolved()

        async def ask() -> ModelTurn:
            response = await inner.get_response(*args, **kwargs)
            return _turn(response, f"{FRAMEWORK}:{getattr(inner, 'model', type(inner).__name__)}")

        return _RESPONSE.validate_python(await durable.model_request(ask, self._asked))

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("agents-stream runs an OpenAI Agents SDK agent with Runner.run, not streamed")

    def get_retry_advice(self, request: Any) -> Any:
        return self._resolved().get_retry_advice(request)  # the SDK's retries of a request not journaled yet

    async def close(self) -> None:
        if self._inner is not None:
            await self._inner.close()


def _journaled_tool(tool: FunctionTool) -> FunctionTool:
    """``tool`` whose every call is a journal entry: a journaled result is returned as it was, else the tool runs
    (the SDK's own invoker: argument checks, its failure handling) under the call's idempotency key."""
    invoke = tool.on_invoke_tool

    async def on_invoke_tool(ctx: Any, arguments: str) -> Any:
        durable = _current()

        async def run() -> ToolOutcome:
            return ToolOutcome(to_jsonable_python(await invoke(ctx, arguments), fallback=str))

        return await durable.tool_call(ctx.tool_call_id, tool.name, _arguments(arguments), run)

    wrapped = copy.copy(tool)  # not replace(): its __post_init__ would bind the SDK's invoker again
    wrapped.on_invoke_tool = on_invoke_tool
    return wrapped


def _turn(response: ModelResponse, source: str) -> ModelTurn:
    """A response as the journal keeps it: the response itself as JSON, and its text and calls for transcripts."""
    calls = tuple({"id": item.call_id, "name": item.name, "arguments": _arguments(item.arguments)}
                  for item in response.output if isinstance(item, ResponseFunctionToolCall))
    usage = response.usage
    return ModelTurn(
        response=_RESPONSE.dump_python(response, mode="json", by_alias=True),
        text="".join(part.text for item in response.output if isinstance(item, ResponseOutputMessage)
                     for part in item.content if isinstance(part, ResponseOutputText)),
        calls=calls, source=source, input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
        provider_calls=max(1, usage.requests),
    )


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _current() -> DurableRun:
    durable = _RUN.get()
    if durable is None:
        raise RuntimeError("this agent's model and tools are journaled by agents-stream and run only inside its "
                           "worker (agent = \"module:NAME\"); run the original agents.Agent elsewhere")
    return durable


def _refused(tool: Any) -> str | None:
    if isinstance(tool, (FunctionTool, *_HOSTED)):
        return None
    return (f"tool {getattr(tool, 'name', type(tool).__name__)!r} is a {type(tool).__name__}, which the worker "
            "would run outside the journal (only function tools and the provider's hosted tools are journaled)")


def _shown(agent: Agent[Any], handoffs: list[str]) -> dict[str, Any]:
    """What the model of ``agent`` is shown and may call: its version's fingerprint is over these."""
    instructions = agent.instructions
    return {
        "instructions": instructions if isinstance(instructions, str) or instructions is None
        else getattr(instructions, "__qualname__", repr(instructions)),
        "tools": sorted(([t.name, getattr(t, "description", ""), getattr(t, "params_json_schema", None)]
                         for t in agent.tools), key=lambda t: str(t[0])),
        "handoffs": sorted(handoffs),
        "output": getattr(agent.output_type, "__qualname__", repr(agent.output_type)),
    }


def _model_error(exc: BaseException) -> BaseException:
    """The OpenAI client's error in ``exc``'s chain, or ``exc``."""
    current: BaseException | None = exc
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        if isinstance(current, openai.OpenAIError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return exc

