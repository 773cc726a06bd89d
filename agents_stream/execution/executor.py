"""Supervised execution of dispatched tasks: the fallback ladder, format retries and routing; no table access.

The ledger hands a task over with ``dispatch``; a pool of call slots runs it
and reports the outcome as an event on the outcomes topic, which the ledger
applies. While a task is here its lease is renewed by heartbeat events.

A task climbs down its agent's ladder (DESIGN.md "Resilience features"):

    primary (high) → alternates (medium) → light model, simplified task (low)
      → last good answer of the same fingerprint (low) → partial result (failed)

cut at the agent's ``lowest`` confidence; when nothing it may use is
available the task is **held** here (no result, offset uncommitted) until a
breaker lets a call through again. Every call goes through the shared
circuits (agents_stream.resilience.circuits): breaker, Retry-After, concurrency and rate
limits. The cheap-first router may put the light model first for an easy
task; that tier escalates to the next when its answer fails the format check
or says its confidence is low.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable

from agents_stream.config import CONFIDENCE_ORDER, AgentConfig, AppConfig
from agents_stream.contract.errors import CircuitOpen, RateLimited, TransientError, classify
from agents_stream.contract.models import TaskPayload
from agents_stream.execution import pricing
from agents_stream.execution.outputs import (
    FormatError,
    OutputSpec,
    corrective,
    fingerprint,
    self_reported_confidence,
    simplify,
    with_format,
)
from agents_stream.execution.router import classifier_prompt, heuristic, parse_classification
from agents_stream.execution.saga_runner import SagaDefinition, StepContext, load_saga
from agents_stream.ops import metrics
from agents_stream.providers.base import Completion, Prompt, Provider
from agents_stream.resilience.backoff import backoff
from agents_stream.resilience.circuits import Circuits
from agents_stream.settings import Settings
from agents_stream.tables import sagas as saga_machine

log = logging.getLogger(__name__)

SendOutcome = Callable[[str, dict[str, Any]], Awaitable[None]]
SendControl = Callable[[str, str, str | None, dict[str, Any]], None]
CacheLookup = Callable[[str, str, int], None]

#: how long a task waits for the cache's answer before treating it as a miss
CACHE_WAIT_S = 5.0


@dataclass(frozen=True)
class Tier:
    """One rung of an agent's ladder."""

    role: str  # primary | alternate | light
    provider: Provider
    confidence: str
    simplified: bool = False
    #: chosen by the router as "adequate": a format failure or a low-confidence answer moves on
    escalates: bool = False


@dataclass
class AgentPlan:
    config: AgentConfig
    tiers: list[Tier]  # the fallback ladder, cut at `lowest`
    light: Provider | None
    classifier: Provider | None
    cache: bool  # may answer from the last good answer
    partial: bool  # may answer with the explicit partial result
    saga: SagaDefinition | None = None  # every task of the agent runs as this saga

    @classmethod
    def build(cls, config: AppConfig, agent: str, provider: Callable[[str], Provider]) -> AgentPlan:
        cfg = config.agents[agent]
        allowed = CONFIDENCE_ORDER.index(cfg.lowest)
        chain = config.chain(agent)
        tiers = [Tier("primary" if i == 0 else "alternate", provider(p.name), "high" if i == 0 else "medium") for i, p in enumerate(chain)]
        light = provider(cfg.light) if cfg.light and config.providers[cfg.light].usable() else None
        if light is not None and allowed >= CONFIDENCE_ORDER.index("low"):
            tiers.append(Tier("light", light, "low", simplified=True))
        tiers = [t for t in tiers if CONFIDENCE_ORDER.index(t.confidence) <= allowed]
        classifier = provider(cfg.classifier) if cfg.classifier and config.providers[cfg.classifier].usable() else None
        # A bad agent-level schema or model is configuration: fail at start, not task by task.
        try:
            if cfg.output_schema is not None:
                OutputSpec.from_schema(cfg.output_schema)
            elif cfg.output_model is not None:
                OutputSpec.from_model(cfg.output_model)
        except ValueError as exc:
            raise ValueError(f"agent {agent!r}: {exc}") from None
        try:
            saga = load_saga(cfg.saga) if cfg.saga else None
        except ValueError as exc:
            raise ValueError(f"agent {agent!r}: {exc}") from None
        return cls(
            saga=saga,
            config=cfg,
            tiers=tiers,
            light=light,
            classifier=classifier,
            cache=cfg.cache_max_age_s > 0 and allowed >= CONFIDENCE_ORDER.index("low"),
            partial=cfg.lowest == "failed",
        )


def _saga_event(report: dict[str, Any]) -> saga_machine.Event:
    event, step, error = report["event"], report["step"], report.get("error", "")
    return {
        "action_succeeded": lambda: saga_machine.ActionSucceeded(step),
        "action_failed": lambda: saga_machine.ActionFailed(step, error),
        "compensation_succeeded": lambda: saga_machine.CompensationSucceeded(step),
        "compensation_failed": lambda: saga_machine.CompensationFailed(step, error),
    }[event]()


def at_least(confidence: str, lowest: str) -> bool:
    return CONFIDENCE_ORDER.index(confidence) <= CONFIDENCE_ORDER.index(lowest)


@dataclass
class Job:
    task: TaskPayload
    dispatch: int
    started: float | None = None
    held: bool = False
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None
    route: str = ""
    #: an answer the router's tier gave before escalating: used if the rest of the ladder is down
    escalated: Any = None
    #: held: how long to stay parked before trying again (seconds)
    wait: float = 0.0
    #: a multi-step task: the outputs of the steps done (from the checkpoint, then this run)
    steps_done: list[Any] = field(default_factory=list)
    #: the lowest confidence and the last source over the steps done in this run
    steps_confidence: str = "high"
    done: asyncio.Event = field(default_factory=asyncio.Event)


# What one rung of the ladder came to.
@dataclass
class _Answer:
    output: Any
    confidence: str
    source: str


@dataclass
class _Unavailable:
    retry_at: float | None
    why: str


@dataclass
class _Rejected:  # the task's own fault: failed result + dead letter
    reason: str
    error: str
    source: str


class Executor:
    def __init__(
        self,
        settings: Settings,
        config: AppConfig,
        plans: dict[str, AgentPlan],
        circuits: Circuits,
        send_outcome: SendOutcome,
        send_control: SendControl,
        on_flow_change: Callable[[], None],
        worker_id: str,
        cache_lookup: CacheLookup | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.config = config
        self.plans = plans
        self.circuits = circuits
        self._send_outcome = send_outcome
        self._send_control = send_control
        self._on_flow_change = on_flow_change
        self._cache_lookup = cache_lookup
        self.worker_id = worker_id
        self._rng = rng or random.Random()
        self.jobs: dict[str, Job] = {}  # task_id → job, queued or running
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._tasks: set[asyncio.Task] = set()
        self._accepting = True
        self._cache_waiters: dict[str, asyncio.Future] = {}
        self._systemic: set[str] = set()  # providers this worker raised a systemic alert for
        self.running = 0
        self.held = 0

    # -- the ledger's side ------------------------------------------------

    def has(self, task_id: str) -> bool:
        return task_id in self.jobs

    def dispatch(self, task: TaskPayload, dispatch: int, steps_done: list[Any] | None = None) -> None:
        """Queue a task (with the steps it has done, for a multi-step one); a free call slot picks it up. Never blocks the ledger."""
        if task.task_id in self.jobs or not self._accepting:
            return
        self.jobs[task.task_id] = Job(task, dispatch, steps_done=list(steps_done or []))
        self._queue.put_nowait(task.task_id)
        if self._queue.qsize() == self.settings.max_queued:
            self._on_flow_change()  # the queue just filled: pause intake

    def blocked(self, agent: str) -> bool:
        """True while the agent should take no new tasks: nothing it may use is available, or the queue is full."""
        if self._queue.qsize() >= self.settings.max_queued:
            return True
        plan = self.plans.get(agent)
        if plan is None:
            return False
        if self._budget_holds(plan):
            return True
        if plan.partial or plan.cache:
            return False  # it can still answer, from the cache or with the partial result
        return not any(self.circuits.available(t.provider.name)[0] for t in plan.tiers)

    def _over_budget(self, plan: AgentPlan) -> float | None:
        """Today's cluster-wide spend when the agent is past its budget, else None."""
        budget = plan.config.budget_usd_per_day
        if budget is None:
            return None
        spent = self.circuits.spend(plan.config.name, pricing.day_key(time.time()))
        return spent if spent >= budget else None

    def _budget_holds(self, plan: AgentPlan) -> bool:
        """Past the budget with nothing cheaper it may use: its tasks hold until the UTC day turns."""
        if self._over_budget(plan) is None:
            return False
        cheaper = plan.config.over_budget == "cheaper" and plan.light is not None and at_least("medium", plan.config.lowest)
        return not cheaper

    def cache_answer(self, task_id: str, answer: dict[str, Any] | None) -> None:
        """The ledger relays the cache's reply to a lookup this worker made."""
        waiter = self._cache_waiters.get(task_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        for _ in range(self.settings.max_in_flight):
            self._spawn(self._slot())
        self._spawn(self._heartbeats())

    def _spawn(self, coro: Awaitable[None]) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def stop(self, grace: float) -> None:
        """Take nothing new; let running calls finish within ``grace``; cancel the rest.

        What is cancelled keeps its uncommitted offset and its lease: another
        worker (or this one, restarted) takes it over when the lease lapses.
        """
        self._accepting = False
        while not self._queue.empty():
            self.jobs.pop(self._queue.get_nowait(), None)
        running = [j.done.wait() for j in self.jobs.values() if j.started is not None and not j.held]
        if running:
            log.info("Shutdown: waiting up to %.1fs for %d provider calls in flight", grace, len(running))
            done, pending = await asyncio.wait([asyncio.ensure_future(w) for w in running], timeout=grace)
            for p in pending:
                p.cancel()
            if pending:
                log.warning(
                    "Shutdown: %d calls did not finish within %.1fs; their tasks resume elsewhere "
                    "when their leases lapse (raise AGENTS_STREAM_SHUTDOWN_GRACE_S to wait longer)",
                    len(pending), grace,
                )
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)
        providers = {t.provider.name: t.provider for plan in self.plans.values() for t in plan.tiers}
        providers.update({p.name: p for plan in self.plans.values() for p in (plan.light, plan.classifier) if p})
        for provider in providers.values():
            try:
                await asyncio.wait_for(provider.close(), timeout=5.0)
            except Exception as exc:  # closing is best effort on the way out
                log.warning("Could not close provider %s cleanly: %r", provider.name, exc)

    # -- the call slots ------------------------------------------------------

    async def _slot(self) -> None:
        while True:
            task_id = await self._queue.get()  # idle slots wait here; stop() cancels them
            job = self.jobs.get(task_id)
            if job is None:
                continue
            if self._queue.qsize() == self.settings.max_queued - 1:
                self._on_flow_change()  # room again: resume intake
            self.running += 1
            if job.started is None:
                job.started = time.monotonic()
            parked = False
            try:
                outcome = await self._run(job)
                if outcome is None:
                    # Held: give the slot back to other work; come back when a circuit changes.
                    parked = True
                    self._spawn(self._park(job))
                else:
                    metrics.answers.labels(
                        job.task.agent_name, outcome.get("status", outcome["kind"]),
                        str(outcome.get("source", "none")).split(":")[0], outcome.get("confidence", "failed"),
                    ).inc()
                    await self._send_outcome(task_id, outcome)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug here must not kill the slot; the lease recovers the task
                log.exception("Executor failed on task %s (its lease will lapse and it will be re-dispatched): %r", task_id, exc)
            finally:
                self.running -= 1
                if not parked:
                    if job.held:
                        self.held -= 1
                    job.done.set()
                    self.jobs.pop(task_id, None)

    async def _park(self, job: Job) -> None:
        """A held task waits here, off the call slots (its lease is still renewed), then queues again."""
        await self.circuits.wait_change(job.wait)
        if self._accepting and self.jobs.get(job.task.task_id) is job:
            self._queue.put_nowait(job.task.task_id)

    async def _run(self, job: Job) -> dict[str, Any] | None:
        """The task's outcome, or None when it must hold (``job.wait`` says for how long at most)."""
        plan = self.plans[job.task.agent_name]
        if plan.saga is not None:
            return await self._run_saga(job, plan.saga)
        if not job.task.steps:
            return await self._answer(job, job.task)
        return await self._run_steps(job)

    async def _run_saga(self, job: Job, definition: SagaDefinition) -> dict[str, Any]:
        """Run the task as a saga. Each report is checkpointed before the next call, so a re-run
        replays the reports and continues; services get the same idempotency key on every attempt."""
        task, shape = job.task, definition.shape
        state, effects = saga_machine.start(shape, task.task_id)
        outputs: dict[str, Any] = {}
        for report in job.steps_done:  # the checkpoint: reports applied before a crash or hold
            state, effects = saga_machine.step(shape, state, _saga_event(report))
            if report["event"] == "action_succeeded":
                outputs[report["step"]] = report.get("output")
        announce = not job.steps_done  # the control events of a replay were sent the first time
        while True:
            if announce:
                for effect in effects:
                    if isinstance(effect, saga_machine.Control):
                        self._send_control(effect.event, task.task_id, task.agent_name, {"saga": shape.name, **effect.details})
            if state.terminal:
                break
            work = next(e for e in effects if not isinstance(e, saga_machine.Control))
            compensating = isinstance(work, saga_machine.RunCompensation)
            step = definition.step(work.step)
            fn = step.compensate if compensating else step.action
            if work.attempt > 1:
                await asyncio.sleep(backoff(work.attempt - 1, base=self.settings.backoff_base_s, cap=self.settings.backoff_cap_s, rng=self._rng))
            ctx = StepContext(task=task, step=work.step, key=work.key, attempt=work.attempt, outputs=dict(outputs))
            kind = "compensation" if compensating else "action"
            try:
                output = await asyncio.wait_for(fn(ctx), definition.timeout_s) if fn is not None else None
                report = {"event": f"{kind}_succeeded", "step": work.step, "output": output}
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the machine decides: compensate, or retry the same key
                log.info("Task %s: saga %s %s %s failed (attempt %d): %s", task.task_id, shape.name, kind, work.step, work.attempt, exc)
                report = {"event": f"{kind}_failed", "step": work.step, "error": str(exc)[:500]}
            await self._send_outcome(task.task_id, {"kind": "step", "dispatch": job.dispatch, "index": len(job.steps_done), "output": report})
            job.steps_done.append(report)
            announce = True
            if report["event"] == "action_succeeded":
                outputs[work.step] = report["output"]
            state, effects = saga_machine.step(shape, state, _saga_event(report))
        if state.status == saga_machine.COMPLETED:
            return {**self._common(job), "kind": "succeeded", "status": "succeeded", "partial": False,
                    "output": outputs, "confidence": "high", "source": f"saga:{shape.name}"}
        return self._rejected(job, _Rejected(
            f"saga_compensated: {state.error}", f"saga {shape.name} failed before its pivot ({state.error}); undone: {list(state.undone)}",
            f"saga:{shape.name}",
        ))

    async def _run_steps(self, job: Job) -> dict[str, Any] | None:
        """A multi-step task: each step's output is checkpointed before the next starts, so a re-run
        (after a crash, a redelivery or a hold) does only the steps not yet done."""
        task = job.task
        steps = task.steps or []
        outcome: dict[str, Any] | None = None
        for index in range(len(job.steps_done), len(steps)):
            job.escalated = None  # each step climbs its own ladder
            outcome = await self._answer(job, self._step_task(task, index, job.steps_done))
            if outcome is None:
                return None  # held; the steps done so far are kept
            if outcome["kind"] != "succeeded" or outcome.get("status") != "succeeded":
                return outcome  # a failed or partial step ends the task
            job.steps_done.append(outcome["output"])
            if CONFIDENCE_ORDER.index(outcome["confidence"]) > CONFIDENCE_ORDER.index(job.steps_confidence):
                job.steps_confidence = outcome["confidence"]
            # Durable before the next step starts: a crash from here on does not repeat this one.
            await self._send_outcome(task.task_id, {"kind": "step", "dispatch": job.dispatch, "index": index, "output": outcome["output"]})
        final = {**self._common(job), "kind": "succeeded", "status": "succeeded", "partial": False}
        final.update(output=list(job.steps_done), confidence=job.steps_confidence,
                     source=(outcome or {}).get("source", "checkpoint"))
        return final

    @staticmethod
    def _step_task(task: TaskPayload, index: int, done: list[Any]) -> TaskPayload:
        step = (task.steps or [])[index]
        text = step.get("instruction", json.dumps(step)) if isinstance(step, dict) else str(step)
        instruction = f"{task.instruction}\n\nStep {index + 1} of {len(task.steps or [])}: {text}"
        context = {**task.context_data, "previous_steps": done} if done else dict(task.context_data)
        return task.model_copy(update={"instruction": instruction, "context_data": context, "steps": None})

    async def _answer(self, job: Job, task: TaskPayload) -> dict[str, Any] | None:
        """One answer through the ladder for ``task`` (the job's task, or one step of it)."""
        plan = self.plans[task.agent_name]
        try:
            spec = OutputSpec.for_task(plan.config, task)
        except ValueError as exc:  # only the task's own schema can be bad here: the agent's was checked at start
            return self._rejected(job, _Rejected("invalid_output_schema", f"the task's output_schema is not a valid JSON Schema: {exc}", "none"))
        tiers, retry_at, budget_hold = self._tiers_for(job, plan)
        if tiers and not job.route and plan.config.router != "off" and plan.light is not None:
            hard, why = await self._estimate(job, plan)
            job.route = ("hard: " if hard else "easy: ") + why
            tiers, retry_at, budget_hold = self._tiers_for(job, plan)
        outcome = None
        if tiers:
            outcome, retry_at = await self._climb(job, task, tiers, spec, plan)
        if outcome is not None:
            self._unhold(job)
            return outcome
        if not budget_hold:
            if job.escalated is not None and at_least(job.escalated.confidence, plan.config.lowest):
                self._unhold(job)  # the router's tier did answer; nothing better is available
                return self._succeeded(job, job.escalated)
            if plan.cache and not job.task.steps:  # the cache keeps whole answers, not steps
                cached = await self._from_cache(job, plan)
                if cached is not None:
                    self._unhold(job)
                    return cached
            if plan.partial:
                self._unhold(job)
                return self._partial(job)
        self._hold(job, job.route if budget_hold else "no provider of its ladder is available")
        now = time.time()
        job.wait = self.settings.probe_interval_s if retry_at is None else min(max(retry_at - now, 0.05), self.settings.probe_interval_s)
        return None

    async def _climb(self, job: Job, task: TaskPayload, tiers: list[Tier], spec: OutputSpec | None, plan: AgentPlan) -> tuple[dict[str, Any] | None, float | None]:
        """Try each rung in order: an answer or a rejection ends the climb; unavailability moves down."""
        earliest: float | None = None
        for i, tier in enumerate(tiers):
            if tier.simplified and job.escalated is not None and job.escalated.source.startswith(f"light:{tier.provider.name}:"):
                continue  # that model already answered the whole task: better than a simplified one
            result = await self._call_tier(job, task, tier, spec, plan)
            last = i + 1 == len(tiers)
            if isinstance(result, _Unavailable):
                if result.retry_at is not None:
                    earliest = result.retry_at if earliest is None else min(earliest, result.retry_at)
                log.debug("Task %s: %s tier %s unavailable (%s)", job.task.task_id, tier.role, tier.provider.name, result.why)
                continue
            if tier.escalates and not last and (isinstance(result, _Rejected) or result.confidence == "low"):
                why = result.error if isinstance(result, _Rejected) else "it answered with low confidence"
                log.info("Task %s: escalating from %s (%s)", job.task.task_id, tier.provider.name, why)
                job.route += f"; escalated from {tier.provider.name}"
                if isinstance(result, _Answer):
                    job.escalated = result  # kept in case nothing above it answers
                continue
            if isinstance(result, _Rejected):
                return self._rejected(job, result), None
            return self._succeeded(job, result), None
        return None, earliest

    def _tiers_for(self, job: Job, plan: AgentPlan) -> tuple[list[Tier], float | None, bool]:
        """The rungs for this task, when to look again if there are none, and whether the budget holds it."""
        cfg = plan.config
        spent = self._over_budget(plan)
        if spent is not None:
            if not self._budget_holds(plan):
                job.route = f"over budget ({spent:.4f} >= {cfg.budget_usd_per_day:g} USD today): light tier only"
                return [Tier("light", plan.light, "medium")], None, False  # type: ignore[arg-type]
            job.route = f"over budget ({spent:.4f} >= {cfg.budget_usd_per_day:g} USD today): held until the UTC day turns"
            return [], float((int(time.time() // 86400) + 1) * 86400), True
        if job.route.startswith("over budget"):
            job.route = ""  # the day turned
        if job.route.startswith("easy") and plan.light is not None and job.escalated is None and "escalated" not in job.route:
            return [Tier("light", plan.light, "high", escalates=True), *plan.tiers], None, False
        return plan.tiers, None, False

    async def _estimate(self, job: Job, plan: AgentPlan) -> tuple[bool, str]:
        cfg = plan.config
        if cfg.router == "classifier" and plan.classifier is not None:
            prompt = Prompt(instruction=f"[task_id={job.task.task_id}]\n{classifier_prompt(job.task)}", max_tokens=8)
            try:
                permit = await self.circuits.acquire(plan.classifier.name)
            except CircuitOpen as exc:
                log.debug("Classifier unavailable (%s): using the heuristic", exc)
            else:
                completion = await self._call(job, plan.classifier, prompt, permit)
                if isinstance(completion, Completion):
                    verdict = parse_classification(completion.text)
                    if verdict is not None:
                        return verdict, f"classifier {plan.classifier.name} said {'hard' if verdict else 'easy'}"
        est = heuristic(job.task, threshold=cfg.hard_threshold, hard_words=cfg.hard_words)
        return est.hard, est.why

    # -- one rung -----------------------------------------------------------------

    async def _call_tier(self, job: Job, task: TaskPayload, tier: Tier, spec: OutputSpec | None, plan: AgentPlan) -> _Answer | _Unavailable | _Rejected:
        provider = tier.provider
        instruction, context = task.instruction, task.context_data
        max_tokens = None
        if tier.simplified:
            instruction, context = simplify(instruction, context)
            max_tokens = max(64, provider.config.max_tokens // 4)
        tag = f"[task_id={task.task_id}]\n"
        prompt = Prompt(instruction=tag + with_format(instruction, spec), system=plan.config.system, context=context, max_tokens=max_tokens)
        retries = format_retries = 0
        while True:
            try:
                permit = await self.circuits.acquire(provider.name)
            except CircuitOpen as exc:
                return _Unavailable(exc.retry_at, str(exc))
            completion = await self._call(job, provider, prompt, permit)
            if isinstance(completion, BaseException):
                exc = completion
                kind = classify(exc)
                if kind == "permanent":
                    return _Rejected(f"permanent_error: {exc}", str(exc), f"{tier.role}:{provider.name}")
                if kind == "systemic":
                    if provider.name not in self._systemic:
                        self._systemic.add(provider.name)
                        log.error("Provider %s cannot be used (%s): its calls fall back or hold; fix its configuration", provider.name, exc)
                        self._send_control("alert.provider_systemic", provider.name, task.agent_name, {"error": str(exc)})
                    return _Unavailable(None, str(exc))
                retries += 1
                if retries > self.settings.max_retries:
                    return _Unavailable(None, f"retries exhausted: {exc}")
                metrics.provider_retries.labels(provider.name, metrics.retry_reason(exc)).inc()
                if isinstance(exc, RateLimited):
                    continue  # the circuits hold the Retry-After now: the next acquire waits or falls back
                retry_after = exc.retry_after if isinstance(exc, TransientError) else None
                delay = backoff(retries, base=self.settings.backoff_base_s, cap=self.settings.backoff_cap_s, retry_after=retry_after, rng=self._rng)
                log.info("Task %s: %s failed (%s), retry %d/%d in %.2fs", task.task_id, provider.name, exc, retries, self.settings.max_retries, delay)
                await asyncio.sleep(delay)
                continue
            self._systemic.discard(provider.name)
            if spec is None:
                output: Any = completion.text
            else:
                try:
                    output = spec.check(completion.text)
                except FormatError as exc:
                    format_retries += 1
                    if format_retries > plan.config.format_retries:
                        return _Rejected(f"invalid_output: {exc}", f"the answer never matched the output schema: {exc}", f"{tier.role}:{provider.name}")
                    log.info("Task %s: %s answered off-format (%s); corrective retry %d/%d", task.task_id, provider.name, exc, format_retries, plan.config.format_retries)
                    metrics.format_retries.labels(task.agent_name).inc()
                    prompt = replace(prompt, instruction=tag + corrective(instruction, str(exc), spec))
                    continue
            confidence = tier.confidence
            said = self_reported_confidence(output)
            if said is not None and CONFIDENCE_ORDER.index(said) > CONFIDENCE_ORDER.index(confidence):
                confidence = said
            return _Answer(output, confidence, f"{tier.role}:{provider.name}:{completion.model}")

    async def _call(self, job: Job, provider: Provider, prompt: Prompt, permit: Any) -> Completion | BaseException:
        """One admitted call: its result goes back to the circuits and its usage onto the job."""
        job.calls += 1
        result, outcome = "failure", "failure"
        retry_after = None
        started = time.monotonic()
        in_flight = metrics.provider_in_flight.labels(provider.name)
        in_flight.inc()
        try:
            async with asyncio.timeout(provider.config.timeout_s + 5.0):  # no task per call, unlike wait_for
                completion = await provider.complete(prompt)
        except asyncio.CancelledError:
            result = outcome = "cancelled"
            raise
        except Exception as exc:
            kind = classify(exc)
            if isinstance(exc, RateLimited):
                result, retry_after = "rate_limited", exc.retry_after
                outcome = result
            elif kind == "permanent":
                result, outcome = "success", "rejected"  # the provider answered; the task is at fault
            return exc
        else:
            result = outcome = "success"
            used_in, used_out = completion.usage.input_tokens, completion.usage.output_tokens
            job.input_tokens += used_in
            job.output_tokens += used_out
            price = self.config.price_of(completion.model) or self.config.price_of(provider.model)
            spent = pricing.cost(price, used_in, used_out)
            job.cost = pricing.add(job.cost, spent)
            agent = job.task.agent_name
            metrics.tokens.labels(agent, provider.name, "input").inc(used_in)
            metrics.tokens.labels(agent, provider.name, "output").inc(used_out)
            if spent:
                metrics.cost.labels(agent, provider.name).inc(spent)
            return completion
        finally:
            in_flight.dec()
            self.circuits.release(permit, "neutral" if result == "cancelled" else result, retry_after=retry_after)
            metrics.provider_calls.labels(provider.name, outcome).inc()
            metrics.provider_latency.labels(provider.name).observe(time.monotonic() - started)

    # -- the bottom of the ladder ---------------------------------------------------

    async def _from_cache(self, job: Job, plan: AgentPlan) -> dict[str, Any] | None:
        if self._cache_lookup is None:
            return None
        task = job.task
        fp = fingerprint(task.agent_name, task.instruction, task.context_data, task.output_schema)
        waiter: asyncio.Future = asyncio.get_running_loop().create_future()
        self._cache_waiters[task.task_id] = waiter
        try:
            self._cache_lookup(task.task_id, fp, job.dispatch)
            answer = await asyncio.wait_for(waiter, CACHE_WAIT_S)
        except asyncio.TimeoutError:
            log.info("Task %s: no cache reply within %.0fs; treating it as a miss", task.task_id, CACHE_WAIT_S)
            answer = None
        finally:
            self._cache_waiters.pop(task.task_id, None)
        if not answer:
            return None
        age = time.time() - float(answer.get("at", 0))
        if age > plan.config.cache_max_age_s:
            log.info("Task %s: cached answer is %.0fs old (> %.0fs): not used", task.task_id, age, plan.config.cache_max_age_s)
            return None
        return self._succeeded(job, _Answer(answer.get("output"), "low", f"cache:{answer.get('task_id', '')}"), cached_at=answer.get("at"))

    def _partial(self, job: Job) -> dict[str, Any]:
        log.warning("Task %s: every tier unavailable; answering with the explicit partial result (lowest = failed)", job.task.task_id)
        return {
            **self._common(job),
            "kind": "succeeded",
            "status": "partial",
            "output": None,
            "confidence": "failed",
            "source": "none",
            "partial": True,
            "error": "every provider of the agent was unavailable",
        }

    # -- holding -------------------------------------------------------------------

    def _hold(self, job: Job, reason: str) -> None:
        if job.held:
            return
        job.held = True
        self.held += 1
        log.warning("Task %s held: %s; it resumes when a breaker lets a call through", job.task.task_id, reason)
        self._send_control("task.held", job.task.task_id, job.task.agent_name, {"reason": reason})
        self._on_flow_change()

    def _unhold(self, job: Job) -> None:
        if job.held:
            job.held = False
            self.held -= 1
            self._send_control("task.released", job.task.task_id, job.task.agent_name, {})

    # -- outcomes ------------------------------------------------------------------

    def _common(self, job: Job) -> dict[str, Any]:
        return {
            "dispatch": job.dispatch,
            "calls": job.calls,
            "usage": {"input_tokens": job.input_tokens, "output_tokens": job.output_tokens, "cost": job.cost},
            "route": job.route.strip() or None,
        }

    def _succeeded(self, job: Job, answer: _Answer, cached_at: float | None = None) -> dict[str, Any]:
        out = {
            **self._common(job),
            "kind": "succeeded",
            "status": "succeeded",
            "output": answer.output,
            "confidence": answer.confidence,
            "source": answer.source,
            "partial": False,
        }
        if cached_at is not None:
            out["cached_at"] = cached_at
        return out

    def _rejected(self, job: Job, rejected: _Rejected) -> dict[str, Any]:
        log.warning("Task %s failed at %s: %s (dead-lettered, error_layer=downstream)", job.task.task_id, rejected.source, rejected.error)
        return {
            **self._common(job),
            "kind": "failed",
            "error": rejected.error,
            "reason": rejected.reason,
            "source": rejected.source,
        }

    async def _heartbeats(self) -> None:
        interval = max(0.2, self.settings.lease_ttl_s / 3.0)
        while True:
            await asyncio.sleep(interval)
            for task_id, job in list(self.jobs.items()):
                try:
                    await self._send_outcome(task_id, {"kind": "heartbeat", "dispatch": job.dispatch, "owner": self.worker_id})
                except Exception as exc:  # next round tries again; the lease has slack for that
                    log.warning("Heartbeat for %s not sent (%r); retrying next round", task_id, exc)
