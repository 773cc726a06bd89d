"""Replay a recorded run against changed agent code: where does the new code stop doing what the recording did?

    recorded = json.loads(Path("tests/recordings/refund.json").read_text())   # AgentRun.recording(), kept earlier
    report = await replay(SUPPORT, recorded)
    assert not report.diverged, report.first       # e.g. "turn 1, call call_1_0 (refund): calls tool 'refund', ..."

The recorded turns answer for the model and the recorded tool results for the tools (nothing runs, nothing is
asked), while the agent's real loop (``execution/agent_loop.py``) decides every step: the limits, the output
check, approvals, agent tools. A step diverges when the new code

- would show the model something else at a turn (its instructions, tools or history differ from the recorded
  request: only a recording that has its requests, ``AgentRun.recording()``, can say);
- cannot make a recorded call (its tool is gone, or refuses the arguments), or would stop it for a human;
- ends elsewhere: fails, finishes, or asks for a turn the recording does not have.

A recording is ``AgentRun.recording()`` (or the AgentRun), a journal (a task record's ``steps_done``), or a
transcript: a result's ``transcript``, a TaskResult, or ``agents-stream tasks show <id> --json``. A transcript
keeps tool names but no arguments or texts, so its calls are checked by name and its final answer is not checked.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from agents_stream.contract.models import TaskPayload
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.agent_loop import Delegated, Done, Failed, Loop, Parked
from agents_stream.execution.outputs import OutputSpec
from agents_stream.execution.run import Rejected, TurnAnswer
from agents_stream.execution.tool_calls import ToolCaller, ToolCalling
from agents_stream.providers.base import Usage
from agents_stream.providers.conversation import Conversation, ToolCall, Turn
from agents_stream.tables import journal
from agents_stream.testing.harness import AgentRun, ModelRequest

__all__ = ["Divergence", "Replay", "ReplayDivergence", "replay"]

#: the ledger's entries: kept from the recording as they are (the loop writes turns, tool results and notes)
_GIVEN = ("decision", "subresult", "message", "summary")


@dataclass(frozen=True)
class Divergence:
    """The first step where the new code parts from the recording: a turn, or one call of it, and how."""

    turn: int
    what: str
    call_id: str | None = None
    tool: str | None = None

    def __str__(self) -> str:
        where = f"turn {self.turn}" + (f", call {self.call_id} ({self.tool})" if self.call_id else "")
        return f"{where}: {self.what}"


class ReplayDivergence(AssertionError):
    """``Replay.check()``: the replay diverged."""


@dataclass
class Replay:
    """What a replay found: every divergence in order (the last stopped it, unless only requests differed)."""

    divergences: list[Divergence] = field(default_factory=list)
    #: the recorded turns the new code went through
    turns: int = 0
    #: the agent versions the recording's turns were written by, and this code's (``Agent.code_version``)
    versions: tuple[str, ...] = ()
    version: str = ""

    @property
    def diverged(self) -> bool:
        return bool(self.divergences)

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    def check(self) -> None:
        """Raise ReplayDivergence naming the first divergence, if any."""
        if self.first is not None:
            raise ReplayDivergence(f"the replay diverges at {self.first}")


async def replay(agent: Agent, recording: Any, *, system: str = "", task: TaskPayload | None = None) -> Replay:
    """Run ``agent``'s loop against ``recording`` (see the module's docstring) and report where it diverges.
    ``system`` is the config's system text, as the recorded run had it; ``task`` the task, when the recording
    does not carry it (a journal, a transcript)."""
    recorded, requests, status, task, args_known = _read(recording, task, agent)
    state = journal.replay(recorded)
    report = Replay(versions=tuple(dict.fromkeys(str(t.get("version")) for t in state.turns)),
                    version=agent.code_version)
    entries: list[dict[str, Any]] = [e for e in recorded if isinstance(e, dict) and e.get("kind") in _GIVEN]

    halted: list[Divergence] = []

    def stop(divergence: Divergence) -> None:  # the loop is made to end here
        report.divergences.append(divergence)
        halted.append(divergence)

    async def ask(conversation: Conversation) -> TurnAnswer | Rejected:
        n = len(journal.replay(entries).turns)
        if n >= len(state.turns):
            now = journal.replay(entries)
            after = f" (it told the model: {now.notes[n - 1][-1][:200]})" if now.notes.get(n - 1) else ""
            ended = " (it failed there)" if status == "failed" else ""
            stop(Divergence(n, f"this code asks the model for turn {n}{after}; the recording ends after turn "
                               f"{n - 1}{ended}"))
            return Rejected("replay", "diverged", "replay")
        if n < len(requests):
            differs = _compare(requests[n], ModelRequest(n, task, conversation).as_json())
            if differs:
                report.divergences.append(Divergence(n, f"the model is shown something else: {differs}"))
        report.turns = n + 1
        t = state.turns[n]
        calls = tuple(ToolCall(c["id"], c["name"], c["arguments"], c.get("error"), c.get("signature"))
                      for c in t["calls"])
        usage = t.get("usage") or {}
        made = Turn(t.get("text", ""), calls, Usage(usage.get("input_tokens", 0), usage.get("output_tokens", 0)),
                    "replay", "replay")
        return TurnAnswer(made, t.get("source", "replay"), t.get("confidence", "high"), t.get("provider_calls", 1),
                          usage.get("cost"))

    async def record(index: int, entry: dict[str, Any]) -> None:
        return None

    spec = None
    if args_known:  # a transcript has no final text to check
        spec = (OutputSpec.from_model(agent.output_model) if agent.output_model
                else OutputSpec.from_schema(task.output_schema) if task.output_schema is not None else None)
    loop = Loop(agent, task, entries, ask=ask, record=record, spec=spec, system=system)
    loop.tools = _Recorded(agent, task, state.results, args_known, stop)
    end = await loop.run()
    if not halted:
        _ending(report, end, state, status)
    return report


class _Recorded(ToolCaller):
    """The tool calls of a replay: each answered with its recorded result once the new code could make it."""

    def __init__(self, agent: Agent, task: TaskPayload, results: dict[tuple[int, str], dict[str, Any]],
                 args_known: bool, stop: Any) -> None:
        super().__init__(agent, task, ToolCalling(backoff_base_s=0.0, backoff_cap_s=0.0, rng=random.Random(0)))
        self.results = results
        self.args_known = args_known
        self.stop = stop

    async def call(self, turn: int, call: dict[str, Any], decision: dict[str, Any] | None = None,
                   subresult: dict[str, Any] | None = None) -> dict[str, Any]:
        recorded = self.results.get((turn, call["id"]))
        tool = self.agent.by_name.get(call["name"])
        why = None
        if recorded is None:
            why = "this code makes the call, the recording has no result for it"
        elif tool is None and not recorded["content"].startswith("there is no tool"):
            why = (f"calls tool {call['name']!r}, which this code does not have "
                   f"(its tools: {', '.join(self.agent.by_name)})")
        elif tool is not None and self.args_known and not call.get("error") and not recorded["error"]:
            try:
                tool.validate(call["arguments"])
            except Exception as exc:
                why = f"this code refuses the recorded arguments: {exc}"
        if why is None and recorded is not None:
            return dict(recorded)
        self.stop(Divergence(turn, why or "", call["id"], call["name"]))
        return {"kind": "tool", "turn": turn, "id": call["id"], "name": call["name"], "content": why, "error": True,
                "fatal": True, "attempts": 0}


def _ending(report: Replay, end: Any, state: journal.LoopState, status: str | None) -> None:
    """How the new code ended, against how the recording did."""
    last = len(state.turns) - 1
    if isinstance(end, Done):
        if report.turns <= last:
            report.divergences.append(Divergence(report.turns - 1, f"this code finishes here; the recording went on "
                                                                   f"to turn {report.turns}"))
        elif status == "failed":
            report.divergences.append(Divergence(last, "this code finishes where the recording failed"))
    elif isinstance(end, Failed):
        if report.turns <= last:
            report.divergences.append(Divergence(max(report.turns - 1, 0), f"this code fails here ({end.reason}); "
                                                                           f"the recording went on"))
        elif status == "succeeded":
            report.divergences.append(Divergence(last, f"this code fails ({end.reason}) where the recording succeeded"))
    elif isinstance(end, Parked):
        if (end.turn, end.call_id) in state.results:
            report.divergences.append(Divergence(end.turn, f"this code waits for a human first ({end.reason}); the "
                                                           f"recording ran the call", end.call_id, end.tool))
    elif isinstance(end, Delegated):
        ran = [c for c in end.calls if (end.turn, c["id"]) in state.results]
        if ran:
            report.divergences.append(Divergence(end.turn, f"this code sends the call to agent {ran[0]['agent']}; "
                                                           f"the recording ran it", ran[0]["id"]))


def _compare(recorded: dict[str, Any], now: dict[str, Any]) -> str | None:
    """The first difference between two requests, in words; None: the same."""
    if recorded.get("system") != now["system"]:
        return f"the system text / instructions changed (was {_cut(recorded.get('system'))}, now {_cut(now['system'])})"
    was = {t["name"]: t for t in recorded.get("tools", [])}
    tools = {t["name"]: t for t in now["tools"]}
    if set(was) != set(tools):
        added, removed = sorted(set(tools) - set(was)), sorted(set(was) - set(tools))
        said = ([f"added {', '.join(added)}"] if added else []) + ([f"removed {', '.join(removed)}"] if removed else [])
        return f"the tools offered changed ({'; '.join(said)})"
    for name, t in tools.items():
        if was[name] != t:
            part = "description" if was[name].get("description") != t["description"] else "arguments' schema"
            return f"tool {name}'s {part} changed"
    old, new = recorded.get("messages", []), now["messages"]
    for i, (a, b) in enumerate(zip(old, new, strict=False)):
        if a != b:
            return f"message {i} of the history changed (was {_cut(a)}, now {_cut(b)})"
    if len(old) != len(new):
        return f"the history has {len(new)} messages, the recorded request had {len(old)}"
    return None


def _cut(value: Any, size: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= size else text[:size] + "…"


def _read(recording: Any, task: TaskPayload | None, agent: Agent,
          ) -> tuple[list[Any], list[dict[str, Any]], str | None, TaskPayload, bool]:
    """(journal, requests, status, task, whether the calls' arguments are known) of any kind of recording."""
    if isinstance(recording, AgentRun):
        recording = recording.recording()
    if isinstance(recording, list):
        return recording, [], None, task or _task(agent), True
    if not isinstance(recording, dict):
        raise TypeError(f"a recording is an AgentRun, its recording(), a journal or a transcript, not {recording!r}")
    if "journal" in recording:
        if task is None and recording.get("task"):
            task = TaskPayload.model_validate(recording["task"])
        return recording["journal"], recording.get("requests", []), recording.get("status"), task or _task(agent), True
    result = recording.get("result") or recording  # a `tasks show --json` view, or a TaskResult
    progress = recording.get("progress") or {}
    found = result.get("transcript") or progress.get("transcript") or recording
    if "turns" not in found:
        raise ValueError("the recording has no journal and no transcript")
    status = result.get("status") if result is not recording or "status" in recording else None
    return _from_transcript(found), [], status, task or _task(agent), False


def _task(agent: Agent) -> TaskPayload:
    return TaskPayload(task_id="replay", agent_name=agent.name, instruction="replay")


def _from_transcript(transcript: dict[str, Any]) -> list[dict[str, Any]]:
    """A journal with what a transcript keeps: each turn's calls (by name, in order), each call's error."""
    calls: dict[int, list[dict[str, Any]]] = {}
    for c in transcript.get("tool_calls", []):
        calls.setdefault(c["turn"], []).append(c)
    entries: list[dict[str, Any]] = []
    for t in transcript.get("turns", []):
        n, pool, made = t["turn"], list(calls.get(t["turn"], [])), []
        for i, name in enumerate(t.get("tool_calls", [])):
            found = next((c for c in pool if c["name"] == name), None)
            if found is not None:
                pool.remove(found)
            made.append({"id": found["id"] if found else f"call_{n}_{i}", "name": name, "arguments": {}})
        entries.append({"kind": "turn", "turn": n, "text": "", "calls": made, "source": t.get("source", "replay"),
                        "confidence": "high", "provider_calls": t.get("provider_calls", 1),
                        "usage": t.get("usage") or {}, "version": t.get("version")})
        for c in calls.get(n, []):
            entries.append({"kind": "tool", "turn": n, "id": c["id"], "name": c["name"], "error": c["error"],
                            "fatal": False, "attempts": c.get("attempts", 1),
                            "content": "(not recorded)"})
    return entries
