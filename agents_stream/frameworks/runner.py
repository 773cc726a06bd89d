"""A framework agent's task on the executor: one run of the agent over the task's journal, its end the outcome.

The task's instruction (and its context) is the agent's user prompt, as a built-in
loop's first message reads; the agent's final output is the task's result. Each
journal entry is sent as a JournalEntry outcome and confirmed before the framework
sees the answer it holds (``DurableRun``), and every model request and tool call
is first checked against the run's membership (a worker the group cut off asks
and runs nothing). The framework's model is its own client, not a rung of the
config's ladder: when it cannot be reached the task is held and tried again from
its journal, as a built-in loop with no provider available is.
"""

from __future__ import annotations

import logging
from typing import Any

from agents_stream.contract.errors import Fenced, Interrupted
from agents_stream.contract.events import JournalEntry, TaskFailed, TaskSucceeded
from agents_stream.contract.models import Usage
from agents_stream.execution import run as outcome
from agents_stream.execution.agent_loop import transcript
from agents_stream.execution.ladder import Ladder
from agents_stream.execution.membership import Membership
from agents_stream.execution.plan import AgentPlan
from agents_stream.execution.run import Rejected, Run
from agents_stream.execution.steps import SendOutcome
from agents_stream.execution.tools import result_text
from agents_stream.frameworks import FrameworkAgent
from agents_stream.frameworks.durable import DurableRun, JournalBroken, JournalMismatch, JournalTooLarge
from agents_stream.kafka.delivery import RECORD_OVERHEAD_BYTES
from agents_stream.settings import Settings
from agents_stream.tables import journal

__all__ = ["FrameworkRunner", "prompt_of", "stopping"]

log = logging.getLogger(__name__)


class FrameworkRunner:
    """Runs the tasks of agents written with a framework (``agent = "module:NAME"`` naming a framework's agent)."""

    def __init__(
        self, settings: Settings, ladder: Ladder, send_outcome: SendOutcome, membership: Membership | None,
    ) -> None:
        self.settings = settings
        self.ladder = ladder
        self._send_outcome = send_outcome
        self.membership = membership

    async def run(self, run: Run, plan: AgentPlan, agent: FrameworkAgent) -> TaskSucceeded | TaskFailed | None:
        """The task's outcome, or None: held (the agent's model cannot be reached now), its journal kept."""
        task = run.task

        async def record(index: int, entry: dict[str, Any]) -> None:
            await self._send_outcome(task.task_id, JournalEntry(worker=run.worker, dispatch=run.dispatch,
                                                                index=index, output=entry))

        async def check() -> None:
            if self.membership is not None:
                await self.membership.check(run)

        task_bytes = len(task.model_dump_json())
        durable = DurableRun(
            task_id=task.task_id, framework=agent.framework, version=agent.version, entries=run.steps_done,
            record=record, check=check, fencing_token=run.dispatch,
            fits=lambda size: task_bytes + size + RECORD_OVERHEAD_BYTES <= self.settings.record_max_bytes,
        )
        source = f"{agent.framework}:{agent.name}"
        try:
            output = await agent.run(prompt_of(task), durable)
        except Exception as exc:
            ours = stopping(exc)
            if isinstance(ours, JournalMismatch):
                return self._failed(run, "agent_upgrade", str(ours), source)
            if isinstance(ours, JournalTooLarge):
                return self._failed(run, "journal_too_large", str(ours), source)
            if ours is not None:  # fenced, interrupted, a failed journal write: the executor stops the run
                raise ours from None
            why = agent.unavailable(exc)
            if why is None:
                error = f"{agent.framework} agent {agent.name!r} failed: {type(exc).__name__}: {exc}"
                return self._failed(run, "framework_error", error, source)
            self.ladder.hold(run, f"{agent.framework} agent {agent.name!r} cannot reach its model ({why})")
            run.wait = self.settings.probe_interval_s
            return None
        self.ladder.release(run)
        log.info("Task %s: %s agent %r finished: %d model request(s) replayed from the journal, %d asked; %d tool "
                 "call(s) replayed, %d run", task.task_id, agent.framework, agent.name, durable.replayed_turns,
                 durable.asked_turns, durable.replayed_calls, durable.ran_calls)
        turns = journal.replay(run.steps_done).turns
        last = turns[-1]["source"] if turns else source
        return TaskSucceeded(**self._common(run), status="succeeded", partial=False, output=output,
                             confidence="high", source=last)

    def _common(self, run: Run) -> dict[str, Any]:
        """Calls, usage and the transcript, summed over every turn the journal holds (earlier dispatches' too)."""
        turns = journal.replay(run.steps_done).turns
        usage = Usage(input_tokens=sum(t["usage"]["input_tokens"] for t in turns),
                      output_tokens=sum(t["usage"]["output_tokens"] for t in turns), cost=None)
        return {**outcome.common(run), "calls": sum(t["provider_calls"] for t in turns), "usage": usage,
                "transcript": transcript(run.steps_done)}

    def _failed(self, run: Run, reason: str, error: str, source: str) -> TaskFailed:
        self.ladder.release(run)
        failed = outcome.rejected(run, Rejected(reason, error, source))
        common = self._common(run)
        return failed.model_copy(update={k: common[k] for k in ("calls", "usage", "transcript")})


#: what the durable run or the executor raises through the framework's code, as it was raised
_OURS = (Fenced, Interrupted, JournalBroken, JournalMismatch, JournalTooLarge)


def stopping(exc: BaseException) -> BaseException | None:
    """The exception of ours that ``exc`` is or carries (a framework may wrap it: in an exception group, as a
    cause), or None: the framework's own error."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, _OURS):
            return current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                todo.append(linked)
    return None


def prompt_of(task: Any) -> str:
    """The agent's user prompt: the task's instruction (its id first, as a built-in loop's first message), and its
    context as JSON."""
    prompt = f"[task_id={task.task_id}]\n{task.instruction}"
    if task.context_data:
        prompt += "\n\nContext (JSON):\n" + result_text(task.context_data)
    return prompt
