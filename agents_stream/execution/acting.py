"""An agent loop on the executor: each turn climbs the agent's ladder, the journal is the task's step checkpoint.

Every model turn goes to the first rung that is available (primary, then the
alternates: a conversation begun on one provider continues on the next, its
history translated by that provider's client); with none available the task is
held, its journal kept. Each journal entry is sent as a JournalEntry outcome and
confirmed by the broker before the loop acts on it, so the ledger keeps it in
the task's record and a re-dispatch resumes from it.
"""

from __future__ import annotations

import random
import time
from functools import partial
from typing import Any

from agents_stream.contract.events import (
    CallParked,
    CallsDelegated,
    DelegatedCall,
    JournalEntry,
    TaskFailed,
    TaskSucceeded,
)
from agents_stream.contract.models import Usage
from agents_stream.execution import run as outcome
from agents_stream.execution import summary
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.agent_loop import Delegated, Done, Failed, Loop, LoopLimits, Parked, RunSignals, transcript
from agents_stream.execution.call import Caller, SendControl
from agents_stream.execution.ladder import Ladder
from agents_stream.execution.membership import GatedAdmission
from agents_stream.execution.outputs import OutputSpec
from agents_stream.execution.plan import AgentPlan
from agents_stream.execution.run import Rejected, Run, TurnAnswer, Unavailable
from agents_stream.execution.steps import SendOutcome
from agents_stream.execution.tool_calls import ToolCalling
from agents_stream.kafka.delivery import RECORD_OVERHEAD_BYTES
from agents_stream.providers.conversation import Conversation
from agents_stream.settings import Settings
from agents_stream.tables import journal

__all__ = ["AgentRunner"]


class AgentRunner:
    """Runs the tasks of agents written in Python (``agent = "package.module:NAME"``) as durable loops."""

    def __init__(
        self, settings: Settings, ladder: Ladder, caller: Caller, send_outcome: SendOutcome,
        send_control: SendControl, rng: random.Random,
    ) -> None:
        self.settings = settings
        self.ladder = ladder
        self.caller = caller
        self._send_outcome = send_outcome
        self._send_control = send_control
        self._rng = rng

    async def run(
        self, run: Run, plan: AgentPlan, agent: Agent, *, final_with_outcome: bool = False,
    ) -> TaskSucceeded | TaskFailed | CallParked | CallsDelegated | None:
        """The task's outcome (CallParked: a call waits for a human), or None: held (no rung available), its
        journal kept in ``run.steps_done``. ``final_with_outcome``: the final answer's entry is left in
        ``run.final_entry``, for the executor to send with the outcome."""
        task = run.task
        try:
            spec = OutputSpec.from_model(agent.output_model) if agent.output_model else OutputSpec.for_task(
                plan.config, task)
        except ValueError as exc:
            why = f"the task's output_schema is not a valid JSON Schema: {exc}"
            return outcome.rejected(run, Rejected("invalid_output_schema", why, "none"))
        settings = self.settings

        async def ask(conversation: Conversation) -> TurnAnswer | Unavailable | Rejected:
            return await self._turn(run, plan, conversation)

        async def record(index: int, entry: dict[str, Any]) -> None:
            journaled = JournalEntry(worker=run.worker, dispatch=run.dispatch, index=index, output=entry)
            await self._send_outcome(task.task_id, journaled)

        loop = Loop(
            agent, task, run.steps_done, ask=ask, record=record, spec=spec, system=plan.config.system,
            limits=LoopLimits(partial(self._fits, len(task.model_dump_json())), settings.output_check_budget_s),
            calling=ToolCalling(
                circuits=self.ladder.circuits if self.caller.membership is None
                else GatedAdmission(self.ladder.circuits, self.caller.membership, run),
                backoff_base_s=settings.backoff_base_s, backoff_cap_s=settings.backoff_cap_s, rng=self._rng,
                trace=run.trace, fencing_token=run.dispatch,
            ),
            signals=RunSignals(
                on_event=lambda event, details: self._send_control(event, task.task_id, task.agent_name, details),
                interrupted=lambda: run.interrupted,
                confirmed_member=(lambda: True) if self.caller.membership is None else self.caller.membership.confirmed,
                final_with_outcome=final_with_outcome,
            ),
        )
        end = await loop.run()
        if loop.final_entry is not None:  # the executor sends it with the final outcome (Executor._send_final)
            index, entry = loop.final_entry
            run.final_entry = JournalEntry(worker=run.worker, dispatch=run.dispatch, index=index, output=entry)
        if isinstance(end, Unavailable):
            self.ladder.hold(run, f"no provider of its ladder is available ({end.why})")
            now, probe = time.time(), settings.probe_interval_s
            run.wait = probe if end.retry_at is None else min(max(end.retry_at - now, 0.05), probe)
            return None
        self.ladder.release(run)
        if isinstance(end, Parked):  # the ledger parks the task at the call: no slot, no lease, no offset held
            return CallParked(worker=run.worker, dispatch=run.dispatch, turn=end.turn, call_id=end.call_id,
                              tool=end.tool, reason=end.reason)
        if isinstance(end, Delegated):  # the ledger publishes the sub-tasks; the task waits without a slot
            calls = [DelegatedCall.model_validate(c) for c in end.calls]
            return CallsDelegated(worker=run.worker, dispatch=run.dispatch, turn=end.turn, calls=calls, trace=run.trace)
        return self._outcome(run, end)

    async def _turn(self, run: Run, plan: AgentPlan, conversation: Conversation) -> TurnAnswer | Unavailable | Rejected:
        """The next turn from the first rung that answers (a simplified light tier cannot carry a conversation)."""
        number = len(journal.replay(run.steps_done).turns)  # the turn asked for (its text streams under it)
        earliest: float | None = None
        why = "the agent has no rung that can carry a conversation"
        for tier in plan.tiers:
            if tier.simplified:
                continue
            answer = await self.caller.converse_tier(run, tier, conversation, number)
            if not isinstance(answer, Unavailable):
                return answer
            why = answer.why
            if answer.retry_at is not None:
                earliest = answer.retry_at if earliest is None else min(earliest, answer.retry_at)
        return Unavailable(earliest, why)

    def _fits(self, task_bytes: int, journal_bytes: int) -> bool:
        """Whether a journal of ``journal_bytes`` still fits, with the task, in one record."""
        return task_bytes + journal_bytes + RECORD_OVERHEAD_BYTES <= self.settings.record_max_bytes

    def _outcome(self, run: Run, end: Done | Failed) -> TaskSucceeded | TaskFailed:
        """The loop's end as an outcome: calls, usage and cost summed over every turn the journal holds."""
        entries = run.steps_done
        turns = journal.replay(entries).turns
        calls, tokens_in, tokens_out, cost = summary.usage(entries)  # a conversation's summary, if it has one
        usage = Usage(
            input_tokens=tokens_in + sum(t["usage"]["input_tokens"] for t in turns),
            output_tokens=tokens_out + sum(t["usage"]["output_tokens"] for t in turns),
            cost=_sum([cost, *(t["usage"]["cost"] for t in turns)]),
        )
        common = {**outcome.common(run), "calls": calls + sum(t["provider_calls"] for t in turns), "usage": usage,
                  "transcript": transcript(entries)}
        if isinstance(end, Done):
            return TaskSucceeded(**common, status="succeeded", partial=False, output=end.output,
                                 confidence=end.confidence, source=end.source)
        failed = outcome.rejected(run, Rejected(end.reason, end.error, end.source))
        return failed.model_copy(update={k: common[k] for k in ("calls", "usage", "transcript")})


def _sum(costs: Any) -> float | None:
    known = [c for c in costs if c is not None]
    return sum(known) if known else None
