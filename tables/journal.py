"""An agent loop's journal: every model turn and tool result, in the order they became durable (pure).

The journal is the task's step checkpoint (``steps_done`` of its ledger record):
a list of JSON entries, each confirmed in the changelog before the loop takes
its next action. ``replay`` reads it back and ``next_action`` says what the loop
does now, so a loop that crashed, was held or waited for an approval resumes
where it was: no journaled model turn is asked again and no journaled tool call
runs again. A call that was running when the worker died has no entry; it runs
again under the same idempotency key, ``call_key``, which a side-effecting tool
must pass to the service it calls.

Entries (dicts, so they are stored and shipped as they are):

    {"kind": "turn", "turn": 0, "text": "...", "calls": [{"id", "name", "arguments", "error"}],
     "source": "primary:openai:gpt-4o", "confidence": "high", "usage": {...}, "provider_calls": 1,
     "version": "3f9a1c2b7d10"}                   (the agent code that asked it: ``Agent.code_version``)
    {"kind": "tool", "turn": 0, "id": "call_1", "name": "refund", "content": "...", "error": false,
     "fatal": false, "attempts": 1}
    {"kind": "note", "turn": 1, "text": "..."}     (a correction the loop told the model: an off-format answer)
    {"kind": "message", "turn": 1, "text": "..."}  (a conversation's message that interrupted the round, appended
                                                   by the ledger; turn -1: before the first turn)
    {"kind": "decision", "turn": 1, "id": "call_2", "decision": "approve", "by": "alice", "comment": ""}
                                                   (a human's decision on a parked call, appended by the ledger)
    {"kind": "subresult", "turn": 1, "id": "call_3", "agent": "analyzer", "result": {...the TaskResult...}}
                                                   (a delegated sub-task's result, appended by the ledger)
    {"kind": "summary", "turn": -1, "text": "...", "until": 12, "error": null, "source": "summary:cheap:m",
     "provider_calls": 1, "usage": {...}}        (a conversation's round: its older history summarised before
                                                   its first turn, execution/summary.py; the loop's steps ignore it)

The journal outlives the code that wrote it (a rolling restart onto new agent
code, docs/upgrades.md): ``next_action`` given the running ``Code`` refuses to
run a journaled call that another version asked for and this one cannot run as
asked (its tool gone, its arguments refused): the task fails ``agent_upgrade``
rather than the loop doing something else in its place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = [
    "AskModel", "Code", "Fail", "Finish", "Limits", "LoopState", "RunTools", "call_key", "next_action", "replay",
    "upgrade_problem",
]


@dataclass(frozen=True)
class Limits:
    max_turns: int
    max_tool_calls: int
    #: tool calls that may fail (an error or invalid arguments sent back to the model) before the task fails
    max_tool_errors: int
    #: corrections of a final answer that did not match the output model
    format_retries: int
    #: tokens (input and output) and USD the task's turns may use; None: no bound
    max_tokens: int | None = None
    max_cost_usd: float | None = None


@dataclass
class LoopState:
    """The journal read back: the turns in order, and the results each turn's calls got so far."""

    turns: list[dict[str, Any]] = field(default_factory=list)
    #: (turn, call id) → the tool entry
    results: dict[tuple[int, str], dict[str, Any]] = field(default_factory=dict)
    #: turn → the notes told to the model after it
    notes: dict[int, list[str]] = field(default_factory=dict)
    #: turn → a conversation's messages that came while it ran (-1: before the first turn), told after it
    messages: dict[int, list[str]] = field(default_factory=dict)
    #: (turn, call id) → a human's decision on that call (written by the ledger when the decision came)
    decisions: dict[tuple[int, str], dict[str, Any]] = field(default_factory=dict)
    #: (turn, call id) → the result of the sub-task that call delegated to another agent (written by the ledger)
    subresults: dict[tuple[int, str], dict[str, Any]] = field(default_factory=dict)

    @property
    def tool_calls(self) -> int:
        return sum(len(t["calls"]) for t in self.turns)

    @property
    def tool_errors(self) -> int:
        return sum(1 for r in self.results.values() if r["error"])


@dataclass(frozen=True)
class Code:
    """The agent code a journal is continued with."""

    #: the agent's name, for the failure's words
    agent: str
    #: ``Agent.code_version``: the same string in every turn this code journals
    version: str
    #: a journaled call → why this code cannot run it (its tool gone, its arguments refused), None when it can
    refuses: Callable[[dict[str, Any]], str | None]


# What the loop does next.
@dataclass(frozen=True)
class AskModel:
    turn: int  # the number of the turn to ask for


@dataclass(frozen=True)
class RunTools:
    turn: int
    calls: tuple[dict[str, Any], ...]  # the calls of that turn without a result yet, in the model's order


@dataclass(frozen=True)
class Finish:
    text: str
    turn: int


@dataclass(frozen=True)
class Fail:
    reason: str  # a short word: max_turns, max_tool_calls, tool_errors, tool_failed, agent_upgrade
    error: str


Action = AskModel | RunTools | Finish | Fail


def call_key(task_id: str, turn: int, call_id: str) -> str:
    """The idempotency key of one tool call: the same for every attempt and every worker that runs it."""
    return f"{task_id}:{turn}:{call_id}"


def replay(entries: list[Any]) -> LoopState:
    """The journal read back. Entries of a turn not yet journaled, and duplicates, change nothing."""
    state = LoopState()
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        kind, turn = entry.get("kind"), entry.get("turn")
        if kind == "turn" and turn == len(state.turns):
            state.turns.append(entry)
        elif kind == "tool" and isinstance(turn, int) and turn < len(state.turns):
            state.results.setdefault((turn, entry["id"]), entry)
        elif kind == "note" and isinstance(turn, int):
            state.notes.setdefault(turn, []).append(entry["text"])
        elif kind == "message" and isinstance(turn, int):
            state.messages.setdefault(turn, []).append(entry["text"])
        elif kind == "decision" and isinstance(turn, int):
            state.decisions.setdefault((turn, entry["id"]), entry)
        elif kind == "subresult" and isinstance(turn, int):
            state.subresults.setdefault((turn, entry["id"]), entry)
    return state


def next_action(state: LoopState, limits: Limits, code: Code | None = None) -> Action:
    """What the loop does now, given what is journaled (``code``: the code that would act, checked against the
    version that journaled the calls it would run)."""
    fatal = next((r for r in state.results.values() if r.get("fatal")), None)
    if fatal is not None:
        return Fail("tool_failed", f"tool {fatal['name']} failed and ends the task: {fatal['content']}")
    if state.tool_errors > limits.max_tool_errors:
        return Fail("tool_errors", f"{state.tool_errors} tool calls failed (more than max_tool_errors "
                                   f"{limits.max_tool_errors}); the last: {_last_error(state)}")
    if not state.turns:
        return AskModel(0)
    last_turn = len(state.turns) - 1
    last = state.turns[last_turn]
    if not last["calls"]:
        if last_turn not in state.notes:  # a final answer; the loop checks it and may journal a note on it
            return Finish(last["text"], last_turn)
        corrections = sum(len(n) for n in state.notes.values())
        if corrections > limits.format_retries:
            why = state.notes[last_turn][-1]
            return Fail("invalid_output", f"the final answer never matched the output model: {why}")
        return _ask(state, limits)
    if state.tool_calls > limits.max_tool_calls:
        return Fail("max_tool_calls", f"the model asked for {state.tool_calls} tool calls "
                                      f"(more than max_tool_calls {limits.max_tool_calls})")
    missing = tuple(c for c in last["calls"] if (last_turn, c["id"]) not in state.results)
    if missing:
        upgrade = None if code is None else upgrade_problem(last, missing, code)
        return upgrade or RunTools(last_turn, missing)
    return _ask(state, limits)


def upgrade_problem(turn: dict[str, Any], missing: tuple[dict[str, Any], ...], code: Code) -> Fail | None:
    """Why ``code`` may not run the calls of ``turn`` still ``missing`` a result, or None when it may.

    A call journaled by this very version that it cannot run is the model's own mistake (a tool it made up,
    arguments that do not fit): the model is told, as always. A call journaled by another version (or by code
    before versions were journaled) may have run there already, its result lost in the crash: running anything
    else in its place (the model told "no such tool" picks another tool, or the same one under a new key) could
    act twice or wrongly, so the task fails and is dead-lettered instead.
    """
    journaled = turn.get("version")
    if journaled == code.version:
        return None
    for call in missing:
        if call.get("error"):  # arguments no version could read: the model is told, nothing ran
            continue
        why = code.refuses(call)
        if why is not None:
            return Fail("agent_upgrade", (
                f"the journal's next step (turn {turn['turn']}, call {call['id']}) calls {why} (journal version "
                f"{journaled or 'unrecorded'}, code version {code.version}); nothing else is called in its place: "
                f"finish or cancel such tasks before removing a tool, or declare the rename "
                f"(Agent(renamed={{old: new}}))"))
    return None


def _ask(state: LoopState, limits: Limits) -> Action:
    if len(state.turns) >= limits.max_turns:
        return Fail("max_turns", f"no final answer within max_turns {limits.max_turns}")
    used = sum(t["usage"].get("input_tokens", 0) + t["usage"].get("output_tokens", 0) for t in state.turns)
    if limits.max_tokens is not None and used >= limits.max_tokens:
        return Fail("budget_exceeded", f"the task's turns used {used} tokens (max_tokens {limits.max_tokens})")
    spent = sum(t["usage"].get("cost") or 0.0 for t in state.turns)
    if limits.max_cost_usd is not None and spent >= limits.max_cost_usd:
        return Fail("budget_exceeded", f"the task's turns cost {spent:.6f} USD (max_cost_usd {limits.max_cost_usd:g})")
    return AskModel(len(state.turns))


def _last_error(state: LoopState) -> str:
    errors = [r for r in state.results.values() if r["error"]]
    return f"{errors[-1]['name']}: {errors[-1]['content'][:200]}" if errors else ""
