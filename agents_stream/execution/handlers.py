"""A routed agent's run: the route decided once and journaled, the handler it names run, escalated when it fails.

A routed agent (``[agents.<name>.routing]``, execution/routing_definitions.py) answers nothing itself: each of its
tasks (a conversation's round, or a task) goes to one of its handlers — other agents of the config, weakest
first. Before any handler runs, the run decides: the first rule that matches, else the classifier (a small model,
asked through the circuits like any call), else the fallback; the decision, its reason and the classifier's cost
are journaled as a ``route`` entry (a JournalEntry, durable before the handler starts; tables/route_journal.py). A run
started again on that journal (a crash, a takeover, a hold) never decides again: no rule is read and no
classifier asked a second time, and the same handler goes on from its own part of the journal.

The handler runs in this run, as if the task were its own (its ladder, its saga, its agent loop with its
journal): the run's task names the handler, its journal is the handler's part. A handler that fails, gives a
partial answer or answers below the route's ``min_confidence`` escalates: an ``escalated`` entry (why, what it
answered, what its tools returned, what it cost) is journaled and the next stronger handler runs, told what the
weaker ones gathered. The strongest handler's outcome is the task's, whatever it is. A handler's tool calls have
idempotency keys of their own (an escalated handler's task id is ``<task id>~<handler>``), so a stronger
handler's calls never meet a weaker one's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from agents_stream.contract.events import (
    CallParked,
    CallsDelegated,
    JournalEntry,
    OutcomeEvent,
    StepDone,
    TaskFailed,
    TaskSucceeded,
)
from agents_stream.contract.models import Usage
from agents_stream.execution import run as outcome
from agents_stream.execution import summary
from agents_stream.execution.call import Caller
from agents_stream.execution.plan import AgentPlan, Tier
from agents_stream.execution.routing_definitions import (
    CLASSIFIER_SYSTEM,
    RouteMessage,
    Routing,
    classifier_prompt,
    parse_choice,
)
from agents_stream.execution.run import Rejected, Run, Unavailable
from agents_stream.execution.steps import SendOutcome
from agents_stream.ops import metrics
from agents_stream.providers.base import Completion, Prompt
from agents_stream.tables import route_journal as routes

__all__ = ["Handlers"]

log = logging.getLogger(__name__)

Outcome = TaskSucceeded | TaskFailed | CallParked | CallsDelegated | None
RunPlan = Callable[[Run, AgentPlan], Awaitable[Outcome]]


@dataclass(frozen=True)
class _Part:
    """A handler running now: its journal entries go to the task's journal from ``base`` on."""

    task_id: str  # the routed task's own id (the handler's may carry ``~<handler>``)
    dispatch: int
    base: int
    prefix: int  # entries before the handler's part that its journal carries (the round's summary)


class Handlers:
    """Runs routed agents' tasks: decide once, journal it, run the handler, escalate."""

    def __init__(self, caller: Caller, plans: dict[str, AgentPlan], send_outcome: SendOutcome,
                 run_plan: RunPlan) -> None:
        self.caller = caller
        self.plans = plans
        self._send_outcome = send_outcome
        self._run_plan = run_plan
        #: the handler's task id → its part, while it runs (``send`` puts its entries where they belong)
        self._parts: dict[str, _Part] = {}

    async def send(self, task_id: str, event: OutcomeEvent) -> None:
        """The runners' outcome sender: a handler's journal entry (or step checkpoint, a handler that runs steps or
        a saga) is numbered in the task's whole journal and sent under the task's own id."""
        part = self._parts.get(task_id)
        if part is not None:
            if isinstance(event, StepDone | JournalEntry) and event.dispatch == part.dispatch:
                event = event.model_copy(update={"index": event.index - part.prefix + part.base})
            task_id = part.task_id
        await self._send_outcome(task_id, event)

    async def run(self, run: Run, plan: AgentPlan) -> Outcome:
        """The routed task's outcome (None: held; CallParked/CallsDelegated: its handler waits in the ledger)."""
        routing = plan.routing
        assert routing is not None
        journal = run.steps_done
        state = routes.read(journal)
        if state.decision is None:
            await self._journal(run, await self._decide(run, plan, routing))
            state = routes.read(journal)
        while True:
            handler = str(state.handler)
            hplan = self.plans.get(handler)
            if hplan is None:  # only a Python route can name an agent this worker does not run: say so, do not crash
                missing = (f"routing: handler {handler!r} is not an agent this worker runs (AGENTS_STREAM_AGENTS, "
                           "or the config's agents)")
                return outcome.rejected(run, Rejected("route_handler_missing", missing, f"route:{handler}"))
            ended = await self._handle(run, hplan, handler, state)
            if ended is None or isinstance(ended, CallParked | CallsDelegated):
                return ended
            stronger = routing.stronger(handler)
            status = ended.status if isinstance(ended, TaskSucceeded) else "failed"
            confidence = ended.confidence if isinstance(ended, TaskSucceeded) else "failed"
            why = routes.below(status, confidence, routing.min_confidence)
            if why is None or stronger is None:
                return self._final(run, ended, hplan)
            await self._journal(run, self._escalation(run, handler, stronger, why, ended, state))
            log.info("Task %s: handler %s escalates to %s: %s", run.task.task_id, handler, stronger, why)
            metrics.routed.labels(run.task.agent_name, stronger, "escalated").inc()
            state = routes.read(journal)

    # -- the decision -------------------------------------------------------

    async def _decide(self, run: Run, plan: AgentPlan, routing: Routing) -> dict[str, Any]:
        task = run.task
        entry: dict[str, Any] = {"kind": routes.ROUTE, "turn": -1, "handler": routing.default, "by": "fallback",
                                 "reason": "", "source": None, "provider_calls": 0,
                                 "usage": {"input_tokens": 0, "output_tokens": 0, "cost": None}}
        ruled = routing.decide(RouteMessage(task.instruction, dict(task.context_data or {})))
        if ruled is not None:
            entry.update(handler=ruled[0], by="rule", reason=ruled[1])
        elif routing.classifier is None:
            entry["reason"] = "no rule matched and the route has no classifier"
        elif plan.route_classifier is None:
            entry["reason"] = f"no rule matched; classifier {routing.classifier} is not usable (its API key is not set)"
        else:
            await self._classify(run, plan, routing, entry)
        metrics.routed.labels(task.agent_name, entry["handler"], entry["by"]).inc()
        log.info("Task %s: routed to %s by %s (%s)", task.task_id, entry["handler"], entry["by"], entry["reason"])
        return entry

    async def _classify(self, run: Run, plan: AgentPlan, routing: Routing, entry: dict[str, Any]) -> None:
        provider = plan.route_classifier
        assert provider is not None
        described = [(h, routing.describe.get(h) or (self.plans[h].config.description if h in self.plans else ""))
                     for h in routing.handlers]
        prompt = Prompt(instruction=f"[task_id={run.task.task_id}]\n" + classifier_prompt(run.task.instruction,
                                                                                         described),
                        system=CLASSIFIER_SYSTEM, max_tokens=32)
        calls, cost = run.calls, run.cost or 0.0
        answer = await self.caller.complete(run, Tier("classifier", provider, "low"), prompt)
        entry.update(provider_calls=run.calls - calls, source=f"classifier:{provider.name}")
        if isinstance(answer, Completion):
            entry.update(source=f"classifier:{provider.name}:{answer.model}", usage={
                "input_tokens": answer.usage.input_tokens, "output_tokens": answer.usage.output_tokens,
                "cost": None if run.cost is None else run.cost - cost})
            chosen = parse_choice(answer.text, routing.handlers)
            if chosen is not None:
                entry.update(handler=chosen, by="classifier", reason=f"the classifier answered {chosen!r}")
                return
            entry["reason"] = f"no rule matched; the classifier's answer {answer.text.strip()[:80]!r} names no handler"
        else:
            why = answer.why if isinstance(answer, Unavailable) else answer.error
            entry["reason"] = f"no rule matched; the classifier {provider.name} gave no answer: {why}"
        log.warning("Task %s: %s; it goes to the fallback %s. If this repeats, check the classifier's provider %s",
                    run.task.task_id, entry["reason"], routing.default, provider.name)

    # -- a handler ----------------------------------------------------------

    async def _handle(self, run: Run, hplan: AgentPlan, handler: str, state: routes.RouteState) -> Outcome:
        """Run ``handler`` on its part of the journal, as if the task were its own; the run is the task's again
        after it (its journal holds what the handler journaled)."""
        journal, task = run.steps_done, run.task
        part, prefix = routes.handler_part(journal, state, keep_summary=hplan.saga is None)
        own_id = task.task_id if not state.escalations else f"{task.task_id}~{handler}"
        told = routes.gathered_text(state.escalations)
        run.task = task.model_copy(update={"agent_name": handler, "task_id": own_id,
                                           "instruction": task.instruction + told})
        run.steps_done = part
        # the handler's own outcome counts only its own calls; the route's are added to the final one
        run.calls, run.input_tokens, run.output_tokens, run.cost, run.route, run.escalated = 0, 0, 0, None, "", None
        self._parts[own_id] = _Part(task.task_id, run.dispatch, state.base, prefix)
        try:
            return await self._run_plan(run, hplan)
        finally:
            self._parts.pop(own_id, None)
            del journal[state.base:]
            journal.extend(part[prefix:])
            run.task, run.steps_done = task, journal

    def _escalation(self, run: Run, handler: str, stronger: str, why: str, ended: TaskSucceeded | TaskFailed,
                    state: routes.RouteState) -> dict[str, Any]:
        answer = ended.error if isinstance(ended, TaskFailed) else ended.output
        text = answer if isinstance(answer, str) or answer is None else str(answer)
        return {"kind": routes.ESCALATED, "turn": -1, "from": handler, "to": stronger, "reason": why,
                "answer": text[: routes.ANSWER_CHARS] if text else None,
                "tools": routes.tools_of(run.steps_done[state.base:]),
                "provider_calls": ended.calls, "usage": ended.usage.model_dump()}

    def _final(self, run: Run, ended: TaskSucceeded | TaskFailed, hplan: AgentPlan) -> TaskSucceeded | TaskFailed:
        """The handler's outcome as the task's: the route's own calls and cost added, the route in its transcript."""
        journal = run.steps_done
        calls, tokens_in, tokens_out, cost = routes.usage_of(journal)
        if hplan.agent is None:  # an agent loop counts the round's summary itself; a prompt or a saga does not
            more = summary.usage(journal)
            calls, tokens_in, tokens_out = calls + more[0], tokens_in + more[1], tokens_out + more[2]
            cost = _plus(cost, more[3])
        usage = Usage(input_tokens=ended.usage.input_tokens + tokens_in,
                      output_tokens=ended.usage.output_tokens + tokens_out, cost=_plus(ended.usage.cost, cost))
        said = routes.route_transcript(journal) or {}
        chain = " → ".join([str(said.get("first")), *(str(e["to"]) for e in said.get("escalations", []))])
        route = f"{chain} ({said.get('by')}: {said.get('reason')})" + (f"; {ended.route}" if ended.route else "")
        transcript = {"turns": [], "tool_calls": [], **(ended.transcript or {}), "route": said}
        return ended.model_copy(update={"calls": ended.calls + calls, "usage": usage, "route": route,
                                        "transcript": transcript})

    async def _journal(self, run: Run, entry: dict[str, Any]) -> None:
        """One entry of the route in the task's journal, durable before the run goes on (or it raises, as a turn)."""
        kept = JournalEntry(worker=run.worker, dispatch=run.dispatch, index=len(run.steps_done), output=entry)
        await self._send_outcome(run.task.task_id, kept)
        run.steps_done.append(entry)


def _plus(a: float | None, b: float | None) -> float | None:
    return None if a is None and b is None else (a or 0.0) + (b or 0.0)

