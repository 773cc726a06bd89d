"""Run an agent's loop in a plain test: no broker, no provider, real tools, the journal in memory.

    from agents_stream.testing import ScriptedModel, call, run_agent

    async def test_refund() -> None:
        run = await run_agent(SUPPORT, "Refund order o-1", model=ScriptedModel([
            call("lookup_order", order_id="o-1"),            # turn 0: one tool call
            call("refund", order_id="o-1", amount=42.5),     # turn 1
            "Refunded 42.50.",                               # turn 2: the final answer
        ]))
        assert run.status == "succeeded" and run.output == "Refunded 42.50."
        assert run.tool_names == ["lookup_order", "refund"]

It is the worker's own loop (``execution/agent_loop.py``) and tool calls (``execution/tool_calls.py``): the same
conversation each turn, the same argument checks, retries, limits, output-model corrections, upgrade rules and
journal entries; only the model is yours and the journal a list. A ``ScriptedModel`` answers from a list of turns,
a ``FunctionModel`` from a function of each request (``ModelRequest``: the turn, the conversation, the results the
model reads), a ``ProviderModel`` over a provider's wire format (the fake LLM server, or a real API). A call that
waits for a human is decided by ``approve``; an agent tool's sub-task is answered by ``agents``; without them the
run ends ``parked`` or ``delegated``, as the task would in a worker. What differs from a worker: no breakers (no
shared circuits), no journal size bound, no hold (a test model is always there), backoff of 10-50 ms.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from agents_stream.contract.models import TaskPayload
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.agent_loop import Delegated, Done, Failed, Loop, Parked, transcript
from agents_stream.execution.outputs import OutputSpec
from agents_stream.execution.run import TurnAnswer, Unavailable
from agents_stream.execution.tool_calls import ToolCalling
from agents_stream.providers.base import Usage
from agents_stream.providers.conversation import (
    AssistantTurn,
    Conversation,
    Message,
    ToolCall,
    ToolResult,
    Turn,
)
from agents_stream.tables import journal

__all__ = [
    "AgentRun", "Call", "FunctionModel", "Model", "ModelReply", "ModelRequest", "ModelTurn", "ProviderModel",
    "ScriptExhausted", "ScriptedModel", "ToolCallRecord", "answer", "call", "run_agent", "turn",
]


@dataclass(frozen=True)
class Call:
    """A tool call the model asks for; ``id`` "" lets the loop name it ``call_<turn>_<i>``."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = ""


@dataclass(frozen=True)
class ModelTurn:
    """One answer of the model: final ``text``, or ``calls`` to make first (with the tokens and cost it reports)."""

    text: str = ""
    calls: tuple[Call, ...] = ()
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None


#: what a test model answers: a string (the final answer), one Call, several Calls (one turn), or a ModelTurn
ModelReply = str | Call | Sequence[Call] | ModelTurn


def call(name: str, arguments: Mapping[str, Any] | None = None, /, **kwargs: Any) -> Call:
    """A call of tool ``name``: ``call("refund", order_id="o-1")`` or ``call("refund", {"order_id": "o-1"})``."""
    return Call(name, {**(arguments or {}), **kwargs})


def answer(text: str, *, input_tokens: int = 0, output_tokens: int = 0, cost: float | None = None) -> ModelTurn:
    """A final answer."""
    return ModelTurn(text, (), input_tokens, output_tokens, cost)


def turn(*calls: Call, text: str = "", input_tokens: int = 0, output_tokens: int = 0,
         cost: float | None = None) -> ModelTurn:
    """One turn asking for several calls at once (they run concurrently, as in a worker)."""
    return ModelTurn(text, calls, input_tokens, output_tokens, cost)


def as_turn(reply: ModelReply) -> ModelTurn:
    if isinstance(reply, ModelTurn):
        return reply
    if isinstance(reply, str):
        return ModelTurn(reply)
    if isinstance(reply, Call):
        return ModelTurn("", (reply,))
    calls = tuple(reply)
    if not all(isinstance(c, Call) for c in calls):
        raise TypeError(f"a model's reply is a str, a Call, a list of Calls or a ModelTurn, not {reply!r}")
    return ModelTurn("", calls)


@dataclass(frozen=True)
class ModelRequest:
    """What the loop asks the model for turn ``turn``: the whole conversation, as a provider would get it."""

    turn: int
    task: TaskPayload
    conversation: Conversation

    @property
    def system(self) -> str:
        return self.conversation.system

    @property
    def tools(self) -> list[str]:
        """The names of the tools on offer."""
        return [t.name for t in self.conversation.tools]

    @property
    def messages(self) -> tuple[Message, ...]:
        return self.conversation.messages

    @property
    def results(self) -> list[ToolResult]:
        """The tool results since the model's last turn (what it reads now), in its calls' order."""
        out: list[ToolResult] = []
        for message in reversed(self.conversation.messages):
            if isinstance(message, AssistantTurn):
                break
            if isinstance(message, ToolResult):
                out.insert(0, message)
        return out

    def result(self, tool: str) -> str | None:
        """The text of the latest result of ``tool`` anywhere in the conversation, or None."""
        found = [m.content for m in self.conversation.messages if isinstance(m, ToolResult) and m.name == tool]
        return found[-1] if found else None

    def as_json(self) -> dict[str, Any]:
        """The request as plain JSON (what a recording keeps, and ``replay`` compares)."""
        conv = self.conversation
        body = {
            "turn": self.turn, "system": conv.system,
            "tools": [dataclasses.asdict(t) for t in conv.tools],
            "messages": [{"type": type(m).__name__, **dataclasses.asdict(m)} for m in conv.messages],
        }
        read: dict[str, Any] = json.loads(json.dumps(body))  # tuples as lists: equal to the request read from a file
        return read


class Model(Protocol):
    """A test model: answers each request of the loop."""

    name: str
    requests: list[ModelRequest]

    async def __call__(self, request: ModelRequest) -> ModelTurn: ...


class ScriptExhausted(AssertionError):
    """The loop asked a ScriptedModel for more turns than its script has."""


class ScriptedModel:
    """Answers from a list, one reply per turn, in order; ``requests`` keeps what it was asked."""

    def __init__(self, replies: Iterable[ModelReply], *, name: str = "scripted") -> None:
        self.name = name
        self.replies = [as_turn(r) for r in replies]
        self.requests: list[ModelRequest] = []

    async def __call__(self, request: ModelRequest) -> ModelTurn:
        self.requests.append(request)
        if request.turn >= len(self.replies):
            last = request.messages[-1] if request.messages else None
            raise ScriptExhausted(f"the loop asked for turn {request.turn} but the script has "
                                  f"{len(self.replies)} turns; the model's last input: {last!r}")
        return self.replies[request.turn]


class FunctionModel:
    """Answers each request with ``fn(request)`` (a function or a coroutine function); ``requests`` keeps them."""

    def __init__(self, fn: Callable[[ModelRequest], ModelReply | Awaitable[ModelReply]], *,
                 name: str = "function") -> None:
        self.name = name
        self.fn = fn
        self.requests: list[ModelRequest] = []

    async def __call__(self, request: ModelRequest) -> ModelTurn:
        self.requests.append(request)
        reply = self.fn(request)
        if inspect.isawaitable(reply):
            reply = await reply
        return as_turn(reply)


class ProviderModel:
    """A provider's client as the model (``agents_stream.providers.build_provider``: one pointed at the fake LLM
    server, or a real API): each turn goes over the wire in the provider's own format."""

    def __init__(self, provider: Any, *, name: str | None = None) -> None:
        self.provider = provider
        self.name = name or getattr(provider, "model", None) or "provider"
        self.requests: list[ModelRequest] = []

    async def __call__(self, request: ModelRequest) -> ModelTurn:
        self.requests.append(request)
        got: Turn = await self.provider.converse(request.conversation)
        calls = tuple(Call(c.name, c.arguments, c.id) for c in got.calls)
        return ModelTurn(got.text, calls, got.usage.input_tokens, got.usage.output_tokens)


@dataclass(frozen=True)
class ToolCallRecord:
    """One tool call as the journal has it: what the model asked and what it read back."""

    turn: int
    id: str
    name: str
    arguments: dict[str, Any]
    content: str
    error: bool
    attempts: int
    #: the idempotency key the tool got (``ctx.key``)
    key: str


@dataclass
class AgentRun:
    """How one run of the loop ended, with its journal (the task record's ``steps_done`` in a worker)."""

    status: Literal["succeeded", "failed", "parked", "delegated"]
    task: TaskPayload
    journal: list[dict[str, Any]]
    requests: list[ModelRequest]
    #: the answer: text, or the JSON value of an ``output_model``; None unless succeeded
    output: Any = None
    #: failed: the short word (max_turns, tool_failed, tool_errors, invalid_output, agent_upgrade, ...) and the error
    reason: str | None = None
    error: str | None = None
    source: str = ""
    #: parked: the call that waits for a human (turn, call id, tool, why); delegated: the sub-tasks' calls
    waiting: tuple[Any, ...] = ()

    @property
    def transcript(self) -> dict[str, Any]:
        """What a worker's result carries as ``transcript``: the turns and the tool calls."""
        return transcript(self.journal)

    @property
    def tool_calls(self) -> list[ToolCallRecord]:
        """Every tool call with a result, in the order the model asked for them."""
        state = journal.replay(self.journal)
        out = []
        for t in state.turns:
            for c in t["calls"]:
                r = state.results.get((t["turn"], c["id"]))
                if r is not None:
                    out.append(ToolCallRecord(t["turn"], c["id"], c["name"], c["arguments"], r["content"], r["error"],
                                              r["attempts"], journal.call_key(self.task.task_id, t["turn"], c["id"])))
        return out

    @property
    def tool_names(self) -> list[str]:
        return [c.name for c in self.tool_calls]

    def calls_of(self, tool: str) -> list[ToolCallRecord]:
        return [c for c in self.tool_calls if c.name == tool]

    def recording(self) -> dict[str, Any]:
        """The run as plain JSON, to keep beside a test and ``replay`` against later code."""
        return {"task": self.task.model_dump(mode="json"), "status": self.status, "journal": self.journal,
                "requests": [r.as_json() for r in self.requests]}


#: a human's decision in a test: given the tool and the call's arguments, approve (True) or reject (False)
Approve = bool | Callable[[str, dict[str, Any]], bool]
#: an agent tool's sub-agent in a test: given the instruction and the context, its output (raise: it failed)
SubAgent = Callable[[str, Any], Any]


async def run_agent(
    agent: Agent, instruction: str = "", *, model: Model | Callable[[ModelRequest], Any] | Iterable[ModelReply],
    context: dict[str, Any] | None = None,
    task_id: str = "test-1", task: TaskPayload | None = None, system: str = "", approve: Approve | None = None,
    agents: Mapping[str, SubAgent] | None = None, entries: list[dict[str, Any]] | None = None,
) -> AgentRun:
    """Run ``agent``'s loop on one task until it ends, with ``model`` answering every turn (a ScriptedModel, a
    FunctionModel or a ProviderModel; a list of replies or a plain function is made one) and the agent's real tools
    running.

    ``task`` replaces the one built from ``instruction``, ``context`` and ``task_id``; ``system`` is the config's
    system text put before the agent's instructions; ``entries`` a journal to resume (a worker's ``steps_done``).
    ``approve`` decides the calls that wait for a human, ``agents`` answers agent tools by agent name.
    """
    task = task or TaskPayload(task_id=task_id, agent_name=agent.name, instruction=instruction or "test",
                               context_data=context or {})
    the_model = _model(model)
    asked_before = len(the_model.requests)  # a model used for an earlier run keeps that run's requests too
    spec = (OutputSpec.from_model(agent.output_model) if agent.output_model
            else OutputSpec.from_schema(task.output_schema) if task.output_schema is not None else None)
    entries = list(entries or [])

    async def ask(conversation: Conversation) -> TurnAnswer:
        number = len(journal.replay(entries).turns)
        reply = await the_model(ModelRequest(number, task, conversation))
        calls = tuple(ToolCall(c.id, c.name, dict(c.arguments)) for c in reply.calls)
        made = Turn(reply.text, calls, Usage(reply.input_tokens, reply.output_tokens), "test", the_model.name)
        return TurnAnswer(made, f"primary:test:{the_model.name}", "high", 1, reply.cost)

    async def record(index: int, entry: dict[str, Any]) -> None:
        # the newest entry: recorded before it joins the journal, or (a tool result) just after, as the next call starts
        newest = index == len(entries) or (index == len(entries) - 1 and entries[index] is entry)
        assert newest, f"journal entry {index} written out of order"

    rng = random.Random(0)
    while True:
        loop = Loop(agent, task, entries, ask=ask, record=record, spec=spec, system=system,
                    calling=ToolCalling(backoff_base_s=0.01, backoff_cap_s=0.05, rng=rng))
        end = await loop.run()
        decided = _decide(end, approve, entries) or await _delegate(end, agents, task, entries)
        if not decided:
            return _ended(end, task, entries, the_model.requests[asked_before:])


def _model(model: Model | Callable[[ModelRequest], Any] | Iterable[ModelReply]) -> Model:
    if isinstance(model, (ScriptedModel, FunctionModel, ProviderModel)):
        return model
    if callable(model):
        return model if hasattr(model, "requests") else FunctionModel(model)  # type: ignore[return-value]
    return ScriptedModel(model)


def _decide(end: Any, approve: Approve | None, entries: list[dict[str, Any]]) -> bool:
    """A parked call decided as a human would (the ledger's decision entry); False: nothing decided."""
    if not isinstance(end, Parked) or approve is None:
        return False
    state = journal.replay(entries)
    arguments = next(c["arguments"] for c in state.turns[end.turn]["calls"] if c["id"] == end.call_id)
    yes = approve if isinstance(approve, bool) else approve(end.tool, arguments)
    entries.append({"kind": "decision", "turn": end.turn, "id": end.call_id,
                    "decision": "approve" if yes else "reject", "by": "test", "comment": ""})
    return True


async def _delegate(end: Any, agents: Mapping[str, SubAgent] | None, task: TaskPayload,
                    entries: list[dict[str, Any]]) -> bool:
    """The sub-tasks of agent tools answered by ``agents`` (the ledger's subresult entries); False: none."""
    if not isinstance(end, Delegated) or agents is None or any(c["agent"] not in agents for c in end.calls):
        return False
    for c in end.calls:
        result: dict[str, Any] = {"task_id": f"{task.task_id}/{c['id']}", "agent_name": c["agent"]}
        try:
            output = agents[c["agent"]](c["instruction"], c.get("context"))
            if inspect.isawaitable(output):
                output = await output
            result |= {"status": "succeeded", "output": output}
        except Exception as exc:  # the sub-task failed: the caller's model reads why
            result |= {"status": "failed", "output": None, "error": f"{type(exc).__name__}: {exc}"}
        entries.append({"kind": "subresult", "turn": end.turn, "id": c["id"], "agent": c["agent"], "result": result})
    return True


def _ended(end: Any, task: TaskPayload, entries: list[dict[str, Any]], requests: list[ModelRequest]) -> AgentRun:
    run = AgentRun("failed", task, entries, list(requests))
    if isinstance(end, Done):
        run.status, run.output, run.source = "succeeded", end.output, end.source
    elif isinstance(end, Failed):
        run.reason, run.error, run.source = end.reason.split(":")[0], end.error, end.source
    elif isinstance(end, Parked):
        run.status, run.waiting = "parked", (end.turn, end.call_id, end.tool, end.reason)
    elif isinstance(end, Delegated):
        run.status, run.waiting = "delegated", end.calls
    elif isinstance(end, Unavailable):  # a test model is always there
        raise AssertionError(f"the loop found no model available: {end.why}")
    return run
