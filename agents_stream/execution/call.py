"""One rung of the ladder: provider calls through the circuits, retries with backoff, the format check and usage."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import replace
from functools import partial
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit

from agents_stream.config import CONFIDENCE_ORDER, AppConfig
from agents_stream.contract.errors import CircuitOpen, RateLimited, ResultTooLarge, TransientError, classify
from agents_stream.contract.models import TaskPayload
from agents_stream.execution import pricing
from agents_stream.execution.chunks import Chunks
from agents_stream.execution.history import shown, with_history
from agents_stream.execution.membership import Membership
from agents_stream.execution.outputs import (
    CheckAborted,
    FormatError,
    OutputSpec,
    corrective,
    self_reported_confidence,
    simplify,
    with_format,
)
from agents_stream.execution.plan import AgentPlan, Tier
from agents_stream.execution.run import Answer, Rejected, Run, TurnAnswer, Unavailable
from agents_stream.ops import metrics, tracing
from agents_stream.providers.base import Completion, Prompt, Provider, TextSink
from agents_stream.providers.conversation import Conversation, Turn
from agents_stream.resilience.backoff import backoff
from agents_stream.resilience.circuits import Circuits, Permit
from agents_stream.settings import Settings

__all__ = ["Caller", "SendControl"]

log = logging.getLogger(__name__)

SendControl = Callable[[str, str, str | None, dict[str, Any]], None]


class Caller:
    """Makes the calls of one worker: every call is admitted by the circuits and its result goes back to them."""

    def __init__(
        self,
        settings: Settings,
        config: AppConfig,
        circuits: Circuits,
        send_control: SendControl,
        rng: random.Random,
        chunks: Chunks | None = None,
        membership: Membership | None = None,
    ) -> None:
        self.settings = settings
        #: asked before every call whether the run may still act here (None: always)
        self.membership = membership
        #: where a round's calls stream their text (None: no call streams)
        self.chunks = chunks
        self.config = config
        self.circuits = circuits
        self._send_control = send_control
        self._rng = rng
        self._systemic: set[str] = set()  # providers this worker raised a systemic alert for

    async def call_tier(
        self, run: Run, task: TaskPayload, tier: Tier, spec: OutputSpec | None, plan: AgentPlan,
    ) -> Answer | Unavailable | Rejected:
        """Ask one rung for ``task`` (the run's task or one step of it): transient errors retry with backoff,
        an off-format answer retries with the corrective instruction."""
        provider = tier.provider
        instruction, context = with_history(task, task.instruction, shown(task, run.steps_done)), task.context_data
        max_tokens = None
        if tier.simplified:
            instruction, context = simplify(instruction, context)
            max_tokens = max(64, provider.config.max_tokens // 4)
        tag = f"[task_id={task.task_id}]\n"
        prompt = Prompt(
            instruction=tag + with_format(instruction, spec), system=plan.config.system, context=context,
            max_tokens=max_tokens,
        )
        retries = [0]  # transient retries, counted across the format retries of this rung
        format_retries = 0
        while True:
            send: Callable[[], Awaitable[Completion | Turn]] = partial(provider.complete, prompt)
            if task is run.task and self._streams(run):  # a round's own answer (not one step of it)
                send = partial(self._streamed, run, 0, partial(provider.complete_stream, prompt))
            completion = await self._answered(run, task, tier, send, retries)
            if not isinstance(completion, Completion):
                assert not isinstance(completion, Turn)
                return completion
            try:
                output = await self._output(completion, tier, spec)
            except FormatError as exc:  # only a schema's check raises it: spec is set
                assert spec is not None
                format_retries += 1
                if format_retries > plan.config.format_retries:
                    return Rejected(
                        f"invalid_output: {exc}", f"the answer never matched the output schema: {exc}",
                        f"{tier.role}:{provider.name}",
                    )
                log.info(
                    "Task %s: %s answered off-format (%s); corrective retry %d/%d",
                    task.task_id, provider.name, exc, format_retries, plan.config.format_retries,
                )
                metrics.format_retries.labels(task.agent_name).inc()
                prompt = replace(prompt, instruction=tag + corrective(instruction, str(exc), spec))
                continue
            if isinstance(output, Rejected):
                return output
            return _answer(tier, output, completion)

    async def _output(self, completion: Completion, tier: Tier, spec: OutputSpec | None) -> Any:
        """The answer's output, or Rejected when no other answer would fare better (too large, a schema that
        cannot be applied). Raises FormatError for an off-format answer (worth a corrective retry)."""
        provider = tier.provider
        size = len(completion.text.encode("utf-8"))
        if size > self.settings.answer_max_bytes:  # it would grow the task's record past what Kafka takes
            error = (
                f"result_too_large: {provider.name} answered {size} bytes > AGENTS_STREAM_ANSWER_MAX_BYTES "
                f"{self.settings.answer_max_bytes}"
            )
            return Rejected(error, error, f"{tier.role}:{provider.name}")
        if spec is None:
            return completion.text
        try:
            return await spec.check_async(completion.text, budget_s=self.settings.output_check_budget_s)
        except CheckAborted as exc:  # the schema cannot be applied: another answer would not fare better
            return Rejected(
                f"output_check_aborted: {exc}", f"the answer could not be checked against the output schema: "
                f"{exc}", f"{tier.role}:{provider.name}",
            )

    def _given_up(self, task: TaskPayload, tier: Tier, exc: BaseException, retry: int) -> Unavailable | Rejected | None:
        """What a failed call ends the rung with, or None when it is worth retry number ``retry``."""
        provider = tier.provider
        kind = classify(exc)
        if kind == "permanent":
            if isinstance(exc, ResultTooLarge):  # its message names its reason already
                return Rejected(str(exc), str(exc), f"{tier.role}:{provider.name}")
            return Rejected(f"permanent_error: {exc}", str(exc), f"{tier.role}:{provider.name}")
        if kind == "systemic":
            if provider.name not in self._systemic:
                self._systemic.add(provider.name)
                log.error(
                    "Provider %s cannot be used (%s): its calls fall back or hold; fix its configuration",
                    provider.name, exc,
                )
                self._send_control("alert.provider_systemic", provider.name, task.agent_name, {"error": str(exc)})
            return Unavailable(None, str(exc))
        if retry > self.settings.max_retries:
            return Unavailable(None, f"retries exhausted: {exc}")
        return None

    async def _pause(self, task: TaskPayload, provider: Provider, exc: BaseException, retries: int) -> None:
        metrics.provider_retries.labels(provider.name, metrics.retry_reason(exc)).inc()
        if isinstance(exc, RateLimited):
            return  # the circuits hold the Retry-After now: the next acquire waits or falls back
        retry_after = exc.retry_after if isinstance(exc, TransientError) else None
        settings = self.settings
        delay = backoff(
            retries, base=settings.backoff_base_s, cap=settings.backoff_cap_s, retry_after=retry_after, rng=self._rng,
        )
        log.info(
            "Task %s: %s failed (%s), retry %d/%d in %.2fs",
            task.task_id, provider.name, exc, retries, settings.max_retries, delay,
        )
        await asyncio.sleep(delay)

    async def complete(self, run: Run, tier: Tier, prompt: Prompt) -> Completion | Unavailable | Rejected:
        """One completion of ``prompt`` from one rung, taken as it is (a conversation's summary): through the
        circuits, transient errors retried with backoff as ``call_tier``'s are."""
        answer = await self._answered(run, run.task, tier, partial(tier.provider.complete, prompt), [0])
        assert not isinstance(answer, Turn)
        return answer

    async def converse_tier(
        self, run: Run, tier: Tier, conversation: Conversation, number: int = 0,
    ) -> TurnAnswer | Unavailable | Rejected:
        """Turn ``number`` of an agent loop on one rung: transient errors retry with backoff, as ``call_tier``'s
        do."""
        provider = tier.provider
        calls, cost = run.calls, run.cost or 0.0
        send: Callable[[], Awaitable[Completion | Turn]] = partial(provider.converse, conversation)
        if self._streams(run):
            send = partial(self._streamed, run, number, partial(provider.converse_stream, conversation))
        turn = await self._answered(run, run.task, tier, send, [0])
        if not isinstance(turn, Turn):
            assert not isinstance(turn, Completion)
            return turn
        size = len(turn.text.encode("utf-8"))
        if size > self.settings.answer_max_bytes:
            error = (f"result_too_large: {provider.name} answered {size} bytes > AGENTS_STREAM_ANSWER_MAX_BYTES "
                     f"{self.settings.answer_max_bytes}")
            return Rejected(error, error, f"{tier.role}:{provider.name}")
        spent = None if run.cost is None else run.cost - cost
        return TurnAnswer(turn, f"{tier.role}:{provider.name}:{turn.model}", tier.confidence, run.calls - calls, spent)

    def _streams(self, run: Run) -> bool:
        return self.chunks is not None and self.chunks.streams(run.task.task_id)

    async def _streamed(
        self, run: Run, number: int, call: Callable[[TextSink], Awaitable[Completion | Turn]],
    ) -> Completion | Turn:
        """One admitted call streaming its text as the chunks of call ``run.calls`` of turn ``number``."""
        assert self.chunks is not None
        stream = self.chunks.open(run.task.task_id, run.dispatch, run.calls, number)
        if stream is None:
            return await call(lambda text: None)
        try:
            return await call(stream.write)
        finally:
            stream.close()  # what a failed call said is sent too: the next attempt's chunks supersede it

    async def _answered(
        self, run: Run, task: TaskPayload, tier: Tier, send: Callable[[], Awaitable[Completion | Turn]],
        retries: list[int],
    ) -> Completion | Turn | Unavailable | Rejected:
        """Calls of ``send`` through the circuits until one answers; transient errors retry with backoff
        (``retries`` counts them, across calls of this method for one rung)."""
        provider = tier.provider
        while True:
            try:  # Fenced: this worker is no longer the member it was dispatched to (Membership.admit)
                permit = await (self.circuits.acquire(provider.name) if self.membership is None
                                else self.membership.admit(run, self.circuits, provider.name))
            except CircuitOpen as exc:
                return Unavailable(exc.retry_at, str(exc))
            answer = await self.admitted(run, provider, permit, send)
            if not isinstance(answer, BaseException):
                self._systemic.discard(provider.name)
                return answer
            verdict = self._given_up(task, tier, answer, retries[0] + 1)
            if verdict is not None:
                return verdict
            retries[0] += 1
            await self._pause(task, provider, answer, retries[0])

    async def call(self, run: Run, provider: Provider, prompt: Prompt, permit: Permit) -> Completion | BaseException:
        """One admitted call: its result goes back to the circuits and its usage onto the run."""
        result = await self.admitted(run, provider, permit, lambda: provider.complete(prompt))
        assert not isinstance(result, Turn)
        return result

    async def admitted(
        self, run: Run, provider: Provider, permit: Permit, send: Callable[[], Awaitable[Completion | Turn]],
    ) -> Completion | Turn | BaseException:
        """One admitted call (``send``): its result goes back to the circuits and its usage onto the run."""
        run.calls += 1
        result, outcome = "failure", "failure"
        retry_after = None
        started = time.monotonic()
        in_flight = metrics.provider_in_flight.labels(provider.name)
        in_flight.inc()
        span = _chat_span(run, provider) if run.trace is not None else None
        try:
            async with asyncio.timeout(provider.config.timeout_s + 5.0):  # no task per call, unlike wait_for
                completion = await send()
        except asyncio.CancelledError:
            result = outcome = "cancelled"
            if span is not None:
                span.fail("cancelled")
            raise
        except Exception as exc:
            if span is not None:
                span.set({"error.type": type(exc).__name__})
                span.fail(f"{type(exc).__name__}: {exc}")
            kind = classify(exc)
            if isinstance(exc, RateLimited):
                result, retry_after = "rate_limited", exc.retry_after
                outcome = result
            elif kind == "permanent":
                result, outcome = "success", "rejected"  # the provider answered; the task is at fault
            return exc
        else:
            result = outcome = "success"
            spent = self._count_usage(run, provider, completion)
            if span is not None:
                span.set({
                    "gen_ai.response.model": completion.model,
                    "gen_ai.usage.input_tokens": completion.usage.input_tokens,
                    "gen_ai.usage.output_tokens": completion.usage.output_tokens, "agents_stream.cost_usd": spent,
                })
            return completion
        finally:
            in_flight.dec()
            if span is not None:
                span.end()
            self.circuits.release(permit, "neutral" if result == "cancelled" else result, retry_after=retry_after)
            metrics.provider_calls.labels(provider.name, outcome).inc()
            metrics.provider_latency.labels(provider.name).observe(time.monotonic() - started)

    def _count_usage(self, run: Run, provider: Provider, completion: Completion | Turn) -> float | None:
        """The call's tokens and cost onto the run and the metrics; its cost (None when no price is known)."""
        used_in, used_out = completion.usage.input_tokens, completion.usage.output_tokens
        run.input_tokens += used_in
        run.output_tokens += used_out
        price = self.config.price_of(completion.model) or self.config.price_of(provider.model)
        spent = pricing.cost(price, used_in, used_out)
        run.cost = pricing.add(run.cost, spent)
        agent = run.task.agent_name
        metrics.tokens.labels(agent, provider.name, "input").inc(used_in)
        metrics.tokens.labels(agent, provider.name, "output").inc(used_out)
        if spent:
            metrics.cost.labels(agent, provider.name).inc(spent)
        return spent


#: gen_ai.system (and gen_ai.provider.name) of each provider kind, as the GenAI semantic conventions name them
_GEN_AI_SYSTEMS = {"gemini": "gcp.gemini", "openai": "openai", "anthropic": "anthropic", "local": "agents_stream.local"}


def _chat_span(run: Run, provider: Provider) -> tracing.Span | None:
    """The span of one model call (GenAI semantic conventions), under the run's dispatch."""
    config = provider.config
    where = urlsplit(config.base_url) if config.base_url else None
    system = _GEN_AI_SYSTEMS.get(config.kind, config.kind)
    return tracing.span(f"chat {provider.model}", run.trace, kind="client", attributes={
        "gen_ai.operation.name": "chat", "gen_ai.system": system, "gen_ai.provider.name": system,
        "gen_ai.request.model": provider.model, "gen_ai.request.max_tokens": config.max_tokens,
        "server.address": where.hostname if where else None, "server.port": where.port if where else None,
        "agents_stream.provider": provider.name, "agents_stream.task_id": run.task.task_id,
        "agents_stream.dispatch": run.dispatch,
    })


def _answer(tier: Tier, output: Any, completion: Completion) -> Answer:
    """The rung's confidence, lowered (never raised) by what the answer says of itself."""
    confidence = tier.confidence
    said = self_reported_confidence(output)
    if said is not None and CONFIDENCE_ORDER.index(said) > CONFIDENCE_ORDER.index(confidence):
        confidence = said
    return Answer(output, confidence, f"{tier.role}:{tier.provider.name}:{completion.model}")
