"""The durable agent loop: replay the journal, ask the model, run the tools it asks for, journal each result.

Each model turn is journaled (``record``: durable before it returns) before the
loop acts on it, so a loop started again on the same journal (after a crash, a
rebalance or a hold) asks no journaled turn again and runs no journaled call
again. A tool result is journaled the same way, but while the group confirms the
worker a member the model is asked the next turn while its record is on its way:
the result is confirmed before the next entry is journaled and before the loop
ends, so nothing acts on an unconfirmed result (a crash meanwhile runs the call
again under its key, and asks the turn again, as a crash during the model call
does). The final answer's entry can go with the task's final outcome instead
(``RunSignals.final_with_outcome``, ``Loop.final_entry``): one write of the
task's record. What the next action is comes from the pure
``tables/journal.py``; this module does the asking and the calling. It has no
I/O of its own: the model is ``ask`` and the journal ``record``, so it is tested
without a broker or a provider.

Each turn journals the agent's ``code_version``; a journal another version
wrote is continued under the upgrade contract (docs/upgrades.md, the rule in
``journal.upgrade_problem``): its results are facts, its pending calls run
under their first keys, and a pending call this code cannot run ends the task
``agent_upgrade`` instead of the loop calling anything else in its place.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Literal

from agents_stream.background import abandon
from agents_stream.contract.errors import Fenced, Interrupted
from agents_stream.contract.models import Confidence, TaskPayload
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.loop_entries import conversation, transcript, turn_entry
from agents_stream.execution.outputs import CheckAborted, FormatError, OutputSpec
from agents_stream.execution.run import Rejected, TurnAnswer, Unavailable
from agents_stream.execution.tool_calls import ToolCaller, ToolCalling
from agents_stream.execution.tools import ToolError, error_detail
from agents_stream.providers.conversation import Conversation
from agents_stream.tables import journal
from agents_stream.tables.journal import AskModel, Fail, Finish, RunTools

__all__ = [
    "Ask", "Delegated", "Done", "Failed", "JournalBroken", "Loop", "LoopLimits", "Parked", "Record", "RunSignals",
    "conversation", "transcript",
]

log = logging.getLogger(__name__)

_CONFIDENCE = ("high", "medium", "low")


#: asks the model for the next turn of the conversation: an answer, no provider available (hold), or the task's fault
Ask = Callable[[Conversation], Awaitable[TurnAnswer | Unavailable | Rejected]]
#: journals entry number ``index`` (called before the entry joins the loop's journal); returns once it is durable.
#: A tool result's record is awaited only before the next entry's, not before the next model call, while the group
#: confirms the worker a member (``RunSignals.confirmed_member``, ``Loop._journal``)
Record = Callable[[int, dict[str, Any]], Awaitable[None]]
#: a control event of the loop (agent.turn, agent.tool_call) and its details
OnEvent = Callable[[str, dict[str, Any]], None]
#: how an entry's record is sent: ``await`` (confirmed before the loop goes on: a turn, a note); ``start`` (a tool
#: result: started now, awaited by the next entry or the loop's end); ``after_next_call`` (a turn's last tool result:
#: started once the next model call's request is out, ``Loop._ask_first``, then as ``start``); ``with_outcome`` (the
#: final answer: not recorded here, the caller sends it with the final outcome, ``Loop.final_entry``)
Journaling = Literal["await", "start", "after_next_call", "with_outcome"]


class JournalBroken(Exception):
    """A journal write failed before this one: the run stops, the next dispatch resumes from the checkpoint."""


@dataclass(frozen=True)
class Done:
    output: Any
    confidence: Confidence
    source: str


@dataclass(frozen=True)
class Parked:
    """A call waits for a human's decision: the task parks at it (the calls of its turn that need none ran)."""

    turn: int
    call_id: str
    tool: str
    reason: str


@dataclass(frozen=True)
class Delegated:
    """Calls of agent tools: the task waits for their sub-tasks (the other calls of the turn ran)."""

    turn: int
    calls: tuple[dict[str, Any], ...]  # id, agent, instruction, context each


@dataclass(frozen=True)
class Failed:
    reason: str
    error: str
    source: str


@dataclass(frozen=True)
class LoopLimits:
    """What bounds a loop besides its agent's own limits: given the journal's size as JSON (bytes), whether the
    task's record can still hold it; and how long checking an answer against its output schema may take."""

    journal_fits: Callable[[int], bool] = lambda _: True
    check_budget_s: float = 1.0


@dataclass(frozen=True)
class RunSignals:
    """The loop's lines to its run: the control events it reports (``on_event(event, details)``), whether the run
    was asked to stop at the next safe point (a conversation's new message), and whether the group confirms the
    worker a member now (``confirmed_member``: a tool result's record holds the next model call only while it does
    not). ``final_with_outcome``: the caller sends the final answer's entry with the task's final outcome
    (``Loop.final_entry``), while the worker is confirmed a member."""

    on_event: OnEvent = lambda event, details: None
    interrupted: Callable[[], bool] = lambda: False
    confirmed_member: Callable[[], bool] = lambda: True
    final_with_outcome: bool = False


class Loop:
    """One task's loop over its journal (``entries``, appended as each entry is journaled; all of them durable when
    ``run`` returns, but ``final_entry``)."""

    def __init__(
        self,
        agent: Agent,
        task: TaskPayload,
        entries: list[Any],
        *,
        ask: Ask,
        record: Record,
        spec: OutputSpec | None = None,
        system: str = "",
        limits: LoopLimits = LoopLimits(),
        calling: ToolCalling = ToolCalling(),
        signals: RunSignals = RunSignals(),
    ) -> None:
        self.agent = agent
        self.task = task
        self.entries = entries
        self._ask = ask
        self._record = record
        self.spec = spec
        self.system = "\n\n".join(filter(None, [system, agent.instructions]))
        self._fits = limits.journal_fits
        self._bytes = len(_compact(entries))  # kept up to date as entries are added: no re-serialising per entry
        self._check_budget_s = limits.check_budget_s
        self.tools = ToolCaller(agent, task, calling)  # how its tools are called: circuits, retries, trace, token
        self._on_event = signals.on_event
        self._interrupted = signals.interrupted
        self._confirmed_member = signals.confirmed_member
        self._final_with_outcome = signals.final_with_outcome
        self._lock = asyncio.Lock()
        self._broken = False
        #: the record of the last tool result, not awaited by the model call after it (``_settle_record``)
        self._pending_record: asyncio.Future[None] | None = None
        #: (index, entry): the last tool result, its record not started yet: it starts once the next model call's
        #: request is out (``_ask_first``), or before anything else the loop journals or settles
        self._unstarted: tuple[int, dict[str, Any]] | None = None
        #: (index, entry): the final answer's entry, in ``entries`` but not recorded. Left here when ``run`` returns
        #: Done: the caller sends it with the final outcome, which the ledger writes to the same task record, so
        #: both are one write. Recorded (awaited) before anything else the loop journals, and on any other end.
        self.final_entry: tuple[int, dict[str, Any]] | None = None
        self.code = journal.Code(task.agent_name, agent.code_version, self._refuses)

    async def run(self) -> Done | Failed | Parked | Delegated | Unavailable:
        """The task's end; Parked at a call a human must decide; Unavailable when no model may be asked now (the
        caller holds the task). Every entry in ``entries`` is durable when it returns or raises Interrupted, but
        ``final_entry`` when it returns Done."""
        try:
            end = await self._steps()
            if isinstance(end, Done) and self.final_entry is not None:
                return end  # no tool result's record is pending: holding the final entry settled it
            await self._settle_record()
            return end
        finally:
            # The run ends on an error (or a cancel): its last result's record, on its way, is not awaited; one not
            # started yet is not sent, and a resumed run calls that tool again, under the same idempotency key.
            if self._pending_record is not None:
                abandon(self._pending_record)

    async def _steps(self) -> Done | Failed | Parked | Delegated | Unavailable:
        self._note_upgrade()
        while True:
            if self._interrupted():  # a safe point: every step so far is journaled, nothing runs
                await self._settle_record()
                raise Interrupted(f"task {self.task.task_id}: its conversation has a new message")
            state = journal.replay(self.entries)
            action = journal.next_action(state, self.agent.limits, self.code)
            match action:
                case AskModel(turn=turn):
                    answer = await self._ask_first(
                        conversation(self.task, self.agent, self.system, self.entries, self.spec))
                    if isinstance(answer, Unavailable):
                        return answer
                    if isinstance(answer, Rejected):
                        return Failed(answer.reason, answer.error, answer.source)
                    entry = turn_entry(turn, answer, self.code.version)
                    # the final answer (no calls): held for the final outcome, when the caller sends it so
                    hold = self._final_with_outcome and not entry["calls"] and self._confirmed_member()
                    failed = await self._journal(entry, "with_outcome" if hold else "await")
                    if failed is not None:
                        return failed
                    self._on_event("agent.turn", {"turn": turn, "source": answer.source,
                                                  "tool_calls": [c["name"] for c in entry["calls"]]})
                case RunTools(turn=turn, calls=calls):
                    waiting = self._first_undecided(state, turn, calls)
                    delegations = self._to_delegate(state, turn, calls)
                    free = tuple(c for c in calls if (waiting is None or c is not waiting[0]) and c not in delegations)
                    failed = await self._run_tools(turn, free, state) if free else None
                    if failed is not None:
                        return failed
                    if delegations:
                        return Delegated(turn, tuple(
                            {"id": c["id"], "agent": self.agent.by_name[c["name"]].delegate,
                             "instruction": c["arguments"]["instruction"], "context": c["arguments"].get("context")}
                            for c in delegations))
                    if waiting is not None:
                        call, reason = waiting
                        return Parked(turn, call["id"], call["name"], reason)
                case Finish(text=text, turn=turn):
                    ended = await self._finish(text, turn, state)
                    if ended is not None:
                        return ended
                case Fail(reason=reason, error=error):
                    return Failed(f"{reason}: {error}", error, _source(state))

    def _refuses(self, call: dict[str, Any]) -> str | None:
        """Why this code cannot run a journaled call as it was asked (``journal.Code.refuses``), or None."""
        tool = self.agent.by_name.get(call["name"])
        if tool is None:
            return f"tool {call['name']!r}, which this version of agent {self.task.agent_name!r} does not have"
        try:
            tool.validate(call["arguments"])
        except ToolError as exc:
            return f"tool {call['name']!r} with arguments this version refuses ({exc})"
        return None

    def _note_upgrade(self) -> None:
        """One log line when this run continues a journal that other code began (what the contract then does)."""
        older = sorted({t.get("version") or "unrecorded" for t in journal.replay(self.entries).turns}
                       - {self.code.version})
        if older:
            log.info("Task %s: continuing a journal written by agent %s version(s) %s with version %s: journaled "
                     "results are kept, pending calls run under their keys, a call this version cannot run ends the "
                     "task (agent_upgrade)", self.task.task_id, self.task.agent_name, ", ".join(older),
                     self.code.version)

    async def _finish(self, text: str, turn: int, state: journal.LoopState) -> Done | Failed | None:
        """The final answer, checked against the output spec; None: a correction was journaled, ask again."""
        source = _source(state)
        confidence = _lowest(t["confidence"] for t in state.turns)
        if self.spec is None:
            return Done(text, confidence, source)
        try:
            output = await self.spec.check_async(text, budget_s=self._check_budget_s)
        except FormatError as exc:
            note = (f"Your final answer was rejected: {exc}. Answer again with only JSON (no prose, no code "
                    f"fence) matching this JSON Schema: {self.spec.describe()}")
            return await self._journal({"kind": "note", "turn": turn, "text": note}, "await")
        except CheckAborted as exc:
            return Failed(f"output_check_aborted: {exc}", f"the answer could not be checked: {exc}", source)
        return Done(output, confidence, source)

    def _to_delegate(
        self, state: journal.LoopState, turn: int, calls: tuple[dict[str, Any], ...],
    ) -> list[dict[str, Any]]:
        """The calls of agent tools still to be sent as sub-tasks (a call that cannot be is told to the model)."""
        out = []
        for call in calls:
            tool = self.agent.by_name.get(call["name"])
            if tool is None or tool.delegate is None or call.get("error") or (turn, call["id"]) in state.subresults:
                continue
            if self.tools.delegation_problem(tool, call) is None:
                out.append(call)
        return out

    def _first_undecided(
        self, state: journal.LoopState, turn: int, calls: tuple[dict[str, Any], ...],
    ) -> tuple[dict[str, Any], str] | None:
        """The first call of the turn that waits for a human, and why (None: every call may run)."""
        for call in calls:
            tool = self.agent.by_name.get(call["name"])
            if tool is None or call.get("error") or (turn, call["id"]) in state.decisions:
                continue
            reason = tool.needs_approval(call["arguments"])
            if reason is not None:
                return call, reason
        return None

    async def _run_tools(
        self, turn: int, calls: tuple[dict[str, Any], ...], state: journal.LoopState,
    ) -> Failed | None:
        """The calls of one turn, concurrently; each result is journaled on its own as it comes."""
        results: list[Failed | None] = [None] * len(calls)

        running = len(calls)

        async def one(i: int, call: dict[str, Any]) -> None:
            nonlocal running
            key = (turn, call["id"])
            entry = await self.tools.call(turn, call, state.decisions.get(key), state.subresults.get(key))
            running -= 1
            results[i] = self._bounded(entry)
            if results[i] is None:
                # A worker the group has not confirmed lately may have lost the task: its result's record (the
                # outcomes topic then, and Fenced) must come before the next model call, which it would waste. The
                # turn's last result goes once the next call's request is out; one that finishes while others of
                # its turn still run goes at once (a crash during a slow call must not lose it).
                how: Journaling = ("await" if not self._confirmed_member()
                                   else "after_next_call" if not running else "start")
                results[i] = await self._journal(entry, how)
            if results[i] is None:
                details = {"turn": turn, "call_id": entry["id"], "tool": entry["name"], "error": entry["error"],
                           "attempts": entry["attempts"]}
                if entry["error"]:  # what went wrong, as the model was told (bounded, secrets redacted)
                    details["detail"] = error_detail(entry["content"])
                    log.info("Task %s: tool %s (call %s, turn %d) failed after %d attempt(s), the model is told: %s",
                             self.task.task_id, entry["name"], entry["id"], turn, entry["attempts"],
                             details["detail"])
                self._on_event("agent.tool_call", details)

        try:
            async with asyncio.TaskGroup() as group:
                for i, call in enumerate(calls):
                    group.create_task(one(i, call))
        except* Fenced as fenced:  # a result journaled after the partition moved: the run stops (Executor)
            raise fenced.exceptions[0] from None
        return next((r for r in results if r is not None), None)

    def _bounded(self, entry: dict[str, Any]) -> Failed | None:
        """A tool result larger than the agent keeps: truncated in place, or the task's journal_too_large."""
        content = entry["content"]
        limit = self.agent.tool_result_max_bytes
        size = len(content.encode("utf-8"))
        if size <= limit:
            return None
        if self.agent.on_large_result == "truncate":
            kept = content.encode("utf-8")[:limit].decode("utf-8", "ignore")
            entry["content"] = f"{kept}\n[truncated: {len(kept.encode('utf-8'))} of {size} bytes kept]"
            return None
        error = (f"journal_too_large: tool {entry['name']} returned {size} bytes > the agent's "
                 f"tool_result_max_bytes {limit}")
        return Failed(error, error, f"tool:{entry['name']}")

    async def _journal(self, entry: dict[str, Any], how: Journaling) -> Failed | None:
        """Add ``entry`` to the journal, its record sent as ``how`` says (``Journaling``); one at a time: indexes
        follow the order of records."""
        async with self._lock:
            await self._settle_record()
            if self._broken:  # an earlier record failed: whether it became durable is unknown, so stop here
                raise JournalBroken(f"task {self.task.task_id}: a journal write failed; the task resumes from "
                                    "its checkpoint when it is dispatched again")
            grown = self._bytes + len(_compact(entry)) + (1 if self.entries else 0)  # and its comma
            if not self._fits(grown):
                error = (f"journal_too_large: with {entry['kind']} entry {len(self.entries) + 1} the agent's "
                         f"journal would not fit in the task's record")
                return Failed(error, error, f"journal:{entry['kind']}")
            if how == "with_outcome":
                self.final_entry = (len(self.entries), entry)
            elif how == "await":
                try:
                    await self._record(len(self.entries), entry)
                except BaseException:
                    self._broken = True
                    raise
            elif how == "after_next_call":
                self._unstarted = (len(self.entries), entry)
            else:
                self._pending_record = asyncio.ensure_future(self._record(len(self.entries), entry))
                await asyncio.sleep(0)  # its first step runs now, as an awaited record's does: before the append
            self.entries.append(entry)
            self._bytes = grown
        return None

    async def _ask_first(self, prompt: Conversation) -> TurnAnswer | Unavailable | Rejected:
        """Ask the model; the last tool result's record, not started yet, starts once the call's request is out.
        The record's transition is the ledger's work on this loop's one thread: done first, it held the request
        back by as long (``bench.agent_loop``, "between two calls"). The next entry awaits the record as before."""
        if self._unstarted is None:
            return await self._ask(prompt)
        asking = asyncio.ensure_future(self._ask(prompt))
        try:
            await asyncio.sleep(0)  # the call runs up to its first wait: its request is written to the socket
            self._start_record()
            await asyncio.sleep(0)  # the record's first step runs now, as an awaited record's does
        except BaseException:  # cancelled: the call goes too (a result not started is not sent: see run)
            asking.cancel()
            raise
        return await asking

    def _start_record(self) -> None:
        """Start the record of the last tool result, if it was not started yet (``_pending_record``)."""
        if self._unstarted is not None:
            (index, entry), self._unstarted = self._unstarted, None
            self._pending_record = asyncio.ensure_future(self._record(index, entry))

    async def _settle_record(self) -> None:
        """Wait for the record of the last tool result, if it is not confirmed yet, and record a held final answer;
        their error is the loop's."""
        self._start_record()
        pending, self._pending_record = self._pending_record, None
        held, self.final_entry = self.final_entry, None
        try:
            if pending is not None:
                await pending
            if held is not None:
                await self._record(*held)
        except BaseException:
            self._broken = True
            raise


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _source(state: journal.LoopState) -> str:
    return state.turns[-1]["source"] if state.turns else "none"


def _lowest(confidences: Any) -> Confidence:
    worst = max((_CONFIDENCE.index(c) for c in confidences if c in _CONFIDENCE), default=0)
    return _CONFIDENCE[worst]  # type: ignore[return-value]
