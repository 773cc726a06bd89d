"""Replay by position: a framework agent's model requests and tool calls as entries of the task's journal.

A framework agent (Pydantic AI, the OpenAI Agents SDK) runs its own loop; the
adapter wraps its model so every request comes here (``DurableRun.model_request``)
and its tools so every call does (``DurableRun.tool_call``). The run is
deterministic given its journal: the n-th model request the framework makes is
turn n of the journal. Journaled, its response is returned as it was (no request
is sent again); not yet journaled, the model is asked, the response is journaled
durably (``record`` returns once the broker confirmed it: the ledger keeps it in
the task's record) and only then handed to the framework. A tool call is looked
up by its turn and call id, not by the order calls finish in (a turn's calls run
concurrently): a journaled result is returned without running the tool, and a
tool that runs sees the call's idempotency key (``idempotency_key()``).

Before anything is asked or run, ``check`` (the run's membership check) may stop
the run: a worker the group cut off asks no model and runs no tool for a task
that moved. A journal that does not fit what the framework asks now (a turn
another framework wrote, a call its response never asked for, another tool
under a journaled call id) raises ``JournalMismatch``: the task ends
``agent_upgrade`` instead of something else running in place of what was
journaled.

Entries are the loop's own kinds (``tables/journal.py``), so transcripts,
progress views and usage sums read them as they read a built-in loop's, plus
``"framework"`` and the framework's own serialized message (``response``,
``result``) the replay hands back:

    {"kind": "turn", "turn": 0, "text": "...", "calls": [{"id", "name", "arguments"}],
     "source": "pydantic_ai:gpt-4o", "confidence": "high", "usage": {...}, "provider_calls": 1,
     "version": "...", "framework": "pydantic_ai", "asked": "...", "response": {...}}
    {"kind": "tool", "turn": 0, "id": "call_1", "name": "refund", "content": "...", "error": false,
     "fatal": false, "attempts": 1, "framework": "pydantic_ai", "result": ...}

No I/O of its own: the model, the tools, the journal's writes and the check are
callables, so it is tested without a broker.
"""

from __future__ import annotations

import asyncio
import json
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from agents_stream.tables import journal

__all__ = [
    "CallContext", "DurableRun", "JournalBroken", "JournalMismatch", "JournalTooLarge", "ModelTurn", "ToolOutcome",
    "call_context", "idempotency_headers", "idempotency_key",
]

#: journals entry number ``index``; returns once it is durable
Record = Callable[[int, dict[str, Any]], Awaitable[None]]
#: returns when the run may act (ask the model, run a tool); raises Fenced when it may not
Check = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class CallContext:
    """The tool call running now: what a framework tool hands to the service it calls."""

    task_id: str
    turn: int
    call_id: str
    #: the idempotency key: the same on every attempt and every worker that runs this call (``journal.call_key``)
    key: str
    #: the task's dispatch number: higher for each worker that takes the task over (docs/security.md, Fencing)
    fencing_token: int


_CALL: ContextVar[CallContext | None] = ContextVar("agents_stream_framework_call", default=None)


def call_context() -> CallContext:
    """The tool call running now; RuntimeError outside one (a tool run by its framework without agents-stream)."""
    current = _CALL.get()
    if current is None:
        raise RuntimeError("no agents-stream tool call is running here: idempotency_key() is known only inside a "
                           "tool that a framework agent calls while agents-stream runs it (agent = \"module:NAME\")")
    return current


def idempotency_key() -> str:
    """The idempotency key of the tool call running now (``<task>:<turn>:<call id>``): pass it to the service."""
    return call_context().key


def idempotency_headers() -> dict[str, str]:
    """The headers a tool's HTTP request carries, as the built-in tools send them: ``Idempotency-Key``, and the
    fencing token with the resource it fences (the task), which a service may check (docs/security.md)."""
    call = call_context()
    return {"Idempotency-Key": call.key, "Fencing-Resource": call.task_id, "Fencing-Token": str(call.fencing_token)}


class JournalMismatch(Exception):
    """The journal holds, at this position, something other than what the framework asks now: the task ends
    (``agent_upgrade``) rather than the run doing something else in place of what was journaled."""


class JournalTooLarge(Exception):
    """The next entry would make the journal too large for the task's record: the task ends (journal_too_large)."""


@dataclass(frozen=True)
class ModelTurn:
    """One model response as the adapter journals it."""

    #: the framework's response, serialized to JSON: what a replay hands back to the framework
    response: Any
    #: its text and tool calls (``{"id", "name", "arguments"}``), as a transcript shows them
    text: str = ""
    calls: tuple[dict[str, Any], ...] = ()
    #: which model answered ("<framework>:<model name>")
    source: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    #: HTTP requests it took (the framework's client may retry)
    provider_calls: int = 1


@dataclass(frozen=True)
class ToolOutcome:
    """One tool call's result as the adapter journals it: JSON (a replay hands it back as it was journaled)."""

    result: Any
    #: the tool failed in a way its framework tells the model (a retry prompt, an error result)
    error: bool = False


@dataclass
class DurableRun:
    """One run of a framework agent over its task's journal (``entries``, appended as each entry is durable)."""

    task_id: str
    #: the adapter's name, marked on every entry ("pydantic_ai", "openai_agents")
    framework: str
    #: the agent's code version, journaled with each turn (shown in transcripts)
    version: str
    entries: list[Any]
    record: Record
    check: Check
    fencing_token: int = 0
    #: given the journal's size as JSON (bytes), whether the task's record can still hold it
    fits: Callable[[int], bool] = lambda _: True
    #: model requests answered so far in this run (replayed or asked): the next request's position
    requests: int = 0
    #: what was replayed and what was done here: model requests and tool calls
    replayed_turns: int = 0
    asked_turns: int = 0
    replayed_calls: int = 0
    ran_calls: int = 0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    _broken: bool = field(default=False, repr=False)
    _bytes: int = field(default=-1, repr=False)

    @property
    def turn(self) -> int:
        """The turn whose tool calls run now: the last model response's (-1 before the first)."""
        return self.requests - 1

    async def model_request(self, ask: Callable[[], Awaitable[ModelTurn]], asked: str = "") -> Any:
        """The response to the framework's next model request: journaled, as it was; else asked (``ask``), made
        durable, then returned. ``asked``: a fingerprint of the request's shape, checked against the journal's."""
        position = self.requests
        journaled = _turns(self.entries)
        if position < len(journaled):
            entry = journaled[position]
            problem = self._turn_problem(entry, asked)
            if problem is not None:
                raise JournalMismatch(f"task {self.task_id}: turn {position} of the journal {problem}; nothing else "
                                      "is asked in its place (finish or cancel such tasks before changing the agent)")
            self.requests += 1
            self.replayed_turns += 1
            return entry["response"]
        await self._may_act()
        turn = await ask()
        entry = {
            "kind": "turn", "turn": position, "text": turn.text, "calls": [dict(c) for c in turn.calls],
            "source": turn.source or self.framework, "confidence": "high",
            "usage": {"input_tokens": turn.input_tokens, "output_tokens": turn.output_tokens, "cost": None},
            "provider_calls": turn.provider_calls, "version": self.version, "framework": self.framework,
            "asked": asked, "response": turn.response,
        }
        await self._journal(entry)
        self.requests += 1
        self.asked_turns += 1
        return turn.response

    async def tool_call(
        self, call_id: str, name: str, arguments: Any, run: Callable[[], Awaitable[ToolOutcome]],
    ) -> Any:
        """The result of tool call ``call_id`` of the last model response: journaled, as it was; else run with
        its idempotency key set (``idempotency_key()``), made durable, then returned."""
        turn = self.turn
        journaled = _turns(self.entries)
        if turn < 0 or turn >= len(journaled):
            raise JournalMismatch(f"task {self.task_id}: the agent calls tool {name!r} (call {call_id}) before any "
                                  "journaled model response asked for it")
        asked = next((c for c in journaled[turn].get("calls", []) if c.get("id") == call_id), None)
        if asked is None or asked.get("name") != name:
            what = "no such call" if asked is None else f"a call of {asked.get('name')!r}"
            raise JournalMismatch(f"task {self.task_id}: the agent calls tool {name!r} as call {call_id} of turn "
                                  f"{turn}, where the journaled response has {what}; nothing else is called in "
                                  "its place (finish or cancel such tasks before changing the agent)")
        done = journal.replay(self.entries).results.get((turn, call_id))
        if done is not None:
            self.replayed_calls += 1
            return done["result"] if "result" in done else done["content"]
        await self._may_act()
        key = journal.call_key(self.task_id, turn, call_id)
        token = _CALL.set(CallContext(self.task_id, turn, call_id, key, self.fencing_token))
        try:
            outcome = await run()
        finally:
            _CALL.reset(token)
        content = outcome.result if isinstance(outcome.result, str) else _compact(outcome.result)
        entry: dict[str, Any] = {
            "kind": "tool", "turn": turn, "id": call_id, "name": name, "content": content, "error": outcome.error,
            "fatal": False, "attempts": 1, "framework": self.framework,
        }
        if not isinstance(outcome.result, str):
            entry["result"] = outcome.result
        await self._journal(entry)
        self.ran_calls += 1
        return outcome.result

    async def _may_act(self) -> None:
        """Before the model is asked or a tool runs: not after a failed write (its fate is unknown), and only while
        the run's membership holds."""
        if self._broken:
            raise JournalBroken(f"task {self.task_id}: a journal write failed; the task resumes from its journal "
                                "when it is dispatched again")
        await self.check()

    def _turn_problem(self, entry: dict[str, Any], asked: str) -> str | None:
        if entry.get("framework") != self.framework or "response" not in entry:
            return (f"was written by {entry.get('framework') or 'the built-in agent loop'}, and this agent runs on "
                    f"{self.framework}")
        if asked and entry.get("asked") and entry["asked"] != asked:
            return (f"answered a request of another shape ({entry['asked']}) than the agent asks now ({asked}): "
                    "its tools or instructions changed since it was journaled")
        return None

    async def _journal(self, entry: dict[str, Any]) -> None:
        """Make ``entry`` durable and add it to the journal, one at a time (indexes follow the order of records)."""
        async with self._lock:
            if self._broken:  # an earlier record failed: whether it became durable is unknown, so stop here
                raise JournalBroken(f"task {self.task_id}: a journal write failed; the task resumes from its "
                                         "journal when it is dispatched again")
            if self._bytes < 0:
                self._bytes = len(_compact(self.entries))
            grown = self._bytes + len(_compact(entry)) + (1 if self.entries else 0)
            if not self.fits(grown):
                raise JournalTooLarge(f"journal_too_large: with {entry['kind']} entry {len(self.entries) + 1} the "
                                      "journal would not fit in the task's record")
            try:
                await self.record(len(self.entries), entry)
            except BaseException:
                self._broken = True
                raise
            self.entries.append(entry)
            self._bytes = grown


class JournalBroken(Exception):
    """A journal write failed before this one: the run stops, the next dispatch resumes from the journal."""


def _turns(entries: list[Any]) -> list[dict[str, Any]]:
    return journal.replay(entries).turns


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
