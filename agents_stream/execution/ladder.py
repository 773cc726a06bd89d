"""The fallback ladder of one task: which rungs, the climb, escalation, the budget, the cache, the partial, holds.

A task climbs down its agent's ladder (docs/guide/failures.md):

    primary (high) → alternates (medium) → light model, simplified task (low)
      → last good answer of the same fingerprint (low) → partial result (failed)

cut at the agent's ``lowest`` confidence; when nothing it may use is
available the task is **held** (no result, offset uncommitted) until a
breaker lets a call through again. The cheap-first router may put the light
model first for an easy task; that tier escalates to the next when its answer
fails the format check or says its confidence is low.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from agents_stream.contract.errors import CircuitOpen
from agents_stream.contract.events import CachedAnswer, TaskFailed, TaskSucceeded
from agents_stream.contract.models import TaskPayload
from agents_stream.execution import pricing
from agents_stream.execution import run as outcome
from agents_stream.execution.call import Caller, SendControl
from agents_stream.execution.outputs import OutputSpec, fingerprint
from agents_stream.execution.plan import AgentPlan, Tier, at_least
from agents_stream.execution.router import classifier_prompt, heuristic, parse_classification
from agents_stream.execution.run import Answer, Rejected, Run, Unavailable
from agents_stream.ops import tracing
from agents_stream.providers.base import Completion, Prompt
from agents_stream.resilience.circuits import Circuits
from agents_stream.settings import Settings

__all__ = ["CACHE_WAIT_S", "Ladder", "LookupFn"]

log = logging.getLogger(__name__)

#: asks the cache for the last good answer of (task_id, fingerprint, dispatch); the reply comes as an outcome
LookupFn = Callable[[str, str, int], None]

#: how long a task waits for the cache's answer before treating it as a miss
CACHE_WAIT_S = 5.0


class Ladder:
    """Climbs a task down its agent's ladder; holds it when nothing it may use is available."""

    def __init__(
        self,
        settings: Settings,
        plans: dict[str, AgentPlan],
        circuits: Circuits,
        caller: Caller,
        send_control: SendControl,
        on_flow_change: Callable[[], None],
        cache_lookup: LookupFn | None = None,
    ) -> None:
        self.settings = settings
        self.plans = plans
        self.circuits = circuits
        self.caller = caller
        self._send_control = send_control
        self._on_flow_change = on_flow_change
        self._cache_lookup = cache_lookup
        self._cache_waiters: dict[str, asyncio.Future[CachedAnswer | None]] = {}
        self.held = 0  # runs held now

    # -- the budget ---------------------------------------------------------------

    def over_budget(self, plan: AgentPlan) -> float | None:
        """Today's cluster-wide spend when the agent is past its budget, else None."""
        budget = plan.config.budget_usd_per_day
        if budget is None:
            return None
        spent = self.circuits.spend(plan.config.name, pricing.day_key(time.time()))
        return spent if spent >= budget else None

    def budget_holds(self, plan: AgentPlan) -> bool:
        """Past the budget with nothing cheaper it may use: its tasks hold until the UTC day turns."""
        if self.over_budget(plan) is None:
            return False
        cfg = plan.config
        cheaper = cfg.over_budget == "cheaper" and plan.light is not None and at_least("medium", cfg.lowest)
        return not cheaper

    # -- one answer ---------------------------------------------------------------

    async def answer(self, run: Run, task: TaskPayload) -> TaskSucceeded | TaskFailed | None:
        """One answer through the ladder for ``task`` (the run's task, or one step of it); None: held
        (``run.wait`` says for how long at most)."""
        plan = self.plans[task.agent_name]
        try:
            spec = OutputSpec.for_task(plan.config, task)
        except ValueError as exc:  # only the task's own schema can be bad here: the agent's was checked at start
            why = f"the task's output_schema is not a valid JSON Schema: {exc}"
            return outcome.rejected(run, Rejected("invalid_output_schema", why, "none"))
        tiers, retry_at, budget_hold = self.tiers_for(run, plan)
        if tiers and not run.route and plan.config.router != "off" and plan.light is not None:
            hard, why = await self.estimate(run, plan)
            run.route = ("hard: " if hard else "easy: ") + why
            tiers, retry_at, budget_hold = self.tiers_for(run, plan)
        result = None
        if tiers:
            result, retry_at = await self.climb(run, task, tiers, spec, plan)
        if result is None and not budget_hold:
            result = await self._bottom(run, plan)
        if result is not None:
            self.release(run)
            return result
        self.hold(run, run.route if budget_hold else "no provider of its ladder is available")
        now = time.time()
        probe = self.settings.probe_interval_s
        run.wait = probe if retry_at is None else min(max(retry_at - now, 0.05), probe)
        return None

    async def _bottom(self, run: Run, plan: AgentPlan) -> TaskSucceeded | None:
        """Below every rung: the router tier's answer, the cache, the partial result, or None (hold)."""
        if run.escalated is not None and at_least(run.escalated.confidence, plan.config.lowest):
            return outcome.succeeded(run, run.escalated)  # the router's tier did answer; nothing better is available
        if plan.cache and not run.task.steps:  # the cache keeps whole answers, not steps
            cached = await self.from_cache(run, plan)
            if cached is not None:
                return cached
        if plan.partial:
            return outcome.partial(run)
        return None

    def tiers_for(self, run: Run, plan: AgentPlan) -> tuple[list[Tier], float | None, bool]:
        """The rungs for this task, when to look again if there are none, and whether the budget holds it."""
        cfg = plan.config
        spent = self.over_budget(plan)
        if spent is not None:
            over = f"over budget ({spent:.4f} >= {cfg.budget_usd_per_day:g} USD today)"
            if not self.budget_holds(plan):
                assert plan.light is not None  # budget_holds is False only with a light model
                run.route = f"{over}: light tier only"
                return [Tier("light", plan.light, "medium")], None, False
            run.route = f"{over}: held until the UTC day turns"
            return [], float((int(time.time() // 86400) + 1) * 86400), True
        if run.route.startswith("over budget"):
            run.route = ""  # the day turned
        easy = run.route.startswith("easy") and run.escalated is None and "escalated" not in run.route
        if easy and plan.light is not None:
            return [Tier("light", plan.light, "high", escalates=True), *plan.tiers], None, False
        return plan.tiers, None, False

    async def estimate(self, run: Run, plan: AgentPlan) -> tuple[bool, str]:
        """Whether the task is hard, and why: the classifier model's verdict, else the heuristic's."""
        cfg = plan.config
        if cfg.router == "classifier" and plan.classifier is not None:
            prompt = Prompt(instruction=f"[task_id={run.task.task_id}]\n{classifier_prompt(run.task)}", max_tokens=8)
            try:
                permit = await self.circuits.acquire(plan.classifier.name)
            except CircuitOpen as exc:
                log.debug("Classifier unavailable (%s): using the heuristic", exc)
            else:
                completion = await self.caller.call(run, plan.classifier, prompt, permit)
                if isinstance(completion, Completion):
                    verdict = parse_classification(completion.text)
                    if verdict is not None:
                        return verdict, f"classifier {plan.classifier.name} said {'hard' if verdict else 'easy'}"
        est = heuristic(run.task, threshold=cfg.hard_threshold, hard_words=cfg.hard_words)
        return est.hard, est.why

    async def climb(
        self, run: Run, task: TaskPayload, tiers: list[Tier], spec: OutputSpec | None, plan: AgentPlan,
    ) -> tuple[TaskSucceeded | TaskFailed | None, float | None]:
        """Try each rung in order: an answer or a rejection ends the climb; unavailability moves down."""
        earliest: float | None = None
        for i, tier in enumerate(tiers):
            esc = run.escalated
            if tier.simplified and esc is not None and esc.source.startswith(f"light:{tier.provider.name}:"):
                continue  # that model already answered the whole task: better than a simplified one
            result = await self.caller.call_tier(run, task, tier, spec, plan)
            last = i + 1 == len(tiers)
            if isinstance(result, Unavailable):
                if result.retry_at is not None:
                    earliest = result.retry_at if earliest is None else min(earliest, result.retry_at)
                log.debug("Task %s: %s tier %s unavailable (%s)", run.task.task_id, tier.role, tier.provider.name,
                          result.why)
                continue
            if tier.escalates and not last and (isinstance(result, Rejected) or result.confidence == "low"):
                why = result.error if isinstance(result, Rejected) else "it answered with low confidence"
                log.info("Task %s: escalating from %s (%s)", run.task.task_id, tier.provider.name, why)
                run.route += f"; escalated from {tier.provider.name}"
                if isinstance(result, Answer):
                    run.escalated = result  # kept in case nothing above it answers
                continue
            if isinstance(result, Rejected):
                return outcome.rejected(run, result), None
            return outcome.succeeded(run, result), None
        return None, earliest

    # -- the cache ------------------------------------------------------------------

    def cache_answer(self, task_id: str, answer: CachedAnswer | None) -> None:
        """The cache's reply to a lookup this worker made (relayed by the ledger)."""
        waiter = self._cache_waiters.get(task_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)

    async def from_cache(self, run: Run, plan: AgentPlan) -> TaskSucceeded | None:
        """The last good answer of the same fingerprint, if the cache has one young enough."""
        task = run.task
        if self._cache_lookup is None or task.conversation is not None:  # a reply depends on its history
            return None
        fp = fingerprint(task.agent_name, task.instruction, task.context_data, task.output_schema)
        waiter: asyncio.Future[CachedAnswer | None] = asyncio.get_running_loop().create_future()
        self._cache_waiters[task.task_id] = waiter
        try:
            self._cache_lookup(task.task_id, fp, run.dispatch)
            answer = await asyncio.wait_for(waiter, CACHE_WAIT_S)
        except asyncio.TimeoutError:
            log.info("Task %s: no cache reply within %.0fs; treating it as a miss", task.task_id, CACHE_WAIT_S)
            answer = None
        finally:
            self._cache_waiters.pop(task.task_id, None)
        if answer is None:
            return None
        age = time.time() - answer.at
        if age > plan.config.cache_max_age_s:
            log.info("Task %s: cached answer is %.0fs old (> %.0fs): not used", task.task_id, age,
                     plan.config.cache_max_age_s)
            return None
        cached = Answer(answer.output, "low", f"cache:{answer.task_id}")
        return outcome.succeeded(run, cached, cached_at=answer.at)

    # -- holding --------------------------------------------------------------------

    def hold(self, run: Run, reason: str) -> None:
        """Nothing it may use is available: say so once (task.held) and let the flow control pause intake."""
        if run.held:
            return
        run.held = True
        run.held_since = time.monotonic()
        self.held += 1
        log.warning("Task %s held: %s; it resumes by itself once that changes (a breaker lets a call through, a "
                    "server's tools are listed)", run.task.task_id, reason)
        self._send_control("task.held", run.task.task_id, run.task.agent_name, {"reason": reason})
        if run.trace is not None:  # the hold as a span of its own, from task.held to task.released
            run.hold_span = tracing.span(f"hold {run.task.agent_name}", run.trace, attributes={
                "agents_stream.task_id": run.task.task_id, "agents_stream.hold.reason": reason})
            if run.hold_span is not None:
                run.hold_span.event("task.held", {"reason": reason})
        self._on_flow_change()

    def release(self, run: Run) -> None:
        """A held run got its answer: task.released."""
        if run.held:
            run.held = False
            run.held_since = None
            self.held -= 1
            self._send_control("task.released", run.task.task_id, run.task.agent_name, {})
            _end_hold(run, "task.released")

    def forget(self, run: Run) -> None:
        """A run leaves the executor without an answer while held (a bug, a cancel): it no longer counts as held."""
        if run.held:
            self.held -= 1
            _end_hold(run, "task.left_held")


def _end_hold(run: Run, event: str) -> None:
    span, run.hold_span = run.hold_span, None
    if span is not None:
        span.event(event)
        span.end()
