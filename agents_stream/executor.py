"""Supervised execution of dispatched tasks: many provider calls in flight, none touching a table.

The ledger hands a task over with ``dispatch``; a pool of call slots runs it
(retries with backoff, hold while the provider is down) and reports the
outcome as an event on the outcomes topic, which the ledger applies. While a
task is here its lease is renewed by heartbeat events.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from agents_stream.backoff import backoff
from agents_stream.errors import TransientError, classify
from agents_stream.health import ProviderHealth
from agents_stream.models import TaskPayload
from agents_stream.providers.base import Completion, Prompt, Provider
from agents_stream.settings import Settings

log = logging.getLogger(__name__)

SendOutcome = Callable[[str, dict[str, Any]], Awaitable[None]]
SendControl = Callable[[str, str, str | None, dict[str, Any]], None]


@dataclass
class Job:
    task: TaskPayload
    dispatch: int
    system: str
    started: float | None = None
    held: bool = False
    calls: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)


class Executor:
    def __init__(
        self,
        settings: Settings,
        providers: dict[str, Provider],
        systems: dict[str, str],
        send_outcome: SendOutcome,
        send_control: SendControl,
        on_flow_change: Callable[[], None],
        worker_id: str,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.providers = providers  # agent name → provider
        self.systems = systems
        self.health = {p.name: ProviderHealth(p.name, settings.probe_interval_s) for p in providers.values()}
        self._send_outcome = send_outcome
        self._send_control = send_control
        self._on_flow_change = on_flow_change
        self.worker_id = worker_id
        self._rng = rng or random.Random()
        self.jobs: dict[str, Job] = {}  # task_id → job, queued or running
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._tasks: set[asyncio.Task] = set()
        self._accepting = True
        self.running = 0

    # -- the ledger's side ------------------------------------------------

    def has(self, task_id: str) -> bool:
        return task_id in self.jobs

    def dispatch(self, task: TaskPayload, dispatch: int) -> None:
        """Queue a task; a free call slot picks it up. Never blocks the ledger."""
        if task.task_id in self.jobs or not self._accepting:
            return
        self.jobs[task.task_id] = Job(task, dispatch, self.systems.get(task.agent_name, ""))
        self._queue.put_nowait(task.task_id)
        if self._queue.qsize() == self.settings.max_queued:
            self._on_flow_change()  # the queue just filled: pause intake

    def blocked(self, agent: str) -> bool:
        """True while the agent should take no new tasks: its provider is down or the queue is full."""
        provider = self.providers.get(agent)
        if provider is not None and self.health[provider.name].is_down:
            return True
        return self._queue.qsize() >= self.settings.max_queued

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
        running = [j.done.wait() for j in self.jobs.values() if j.started is not None]
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
        for provider in {p.name: p for p in self.providers.values()}.values():
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
            job.started = time.monotonic()
            try:
                outcome = await self._run(job)
                await self._send_outcome(task_id, outcome)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug here must not kill the slot; the lease recovers the task
                log.exception("Executor failed on task %s (its lease will lapse and it will be re-dispatched): %r", task_id, exc)
            finally:
                self.running -= 1
                job.done.set()
                self.jobs.pop(task_id, None)

    async def _run(self, job: Job) -> dict[str, Any]:
        task = job.task
        provider = self.providers[task.agent_name]
        health = self.health[provider.name]
        prompt = Prompt(
            instruction=f"[task_id={task.task_id}]\n{task.instruction}",
            system=job.system,
            context=task.context_data,
        )
        retries = 0
        while True:
            probing = False
            if health.is_down:
                if not job.held:
                    self._hold(job, provider, health, health.reason, alert=False)
                probing = await health.wait_turn()
            try:
                job.calls += 1
                completion = await asyncio.wait_for(provider.complete(prompt), timeout=provider.config.timeout_s + 5.0)
            except Exception as exc:
                if probing:
                    health.probe_done()
                kind = classify(exc)
                if kind == "permanent":
                    return self._failed(job, provider, exc)
                if kind == "systemic":
                    self._hold(job, provider, health, f"systemic: {exc}", alert=True)
                    continue
                if probing:
                    continue  # still down: wait for the next probe turn
                retries += 1
                if retries > self.settings.max_retries:
                    self._hold(job, provider, health, f"retries exhausted: {exc}", alert=False)
                    retries = 0
                    continue
                retry_after = exc.retry_after if isinstance(exc, TransientError) else None
                delay = backoff(
                    retries,
                    base=self.settings.backoff_base_s,
                    cap=self.settings.backoff_cap_s,
                    retry_after=retry_after,
                    rng=self._rng,
                )
                log.info(
                    "Task %s: %s failed (%s), retry %d/%d in %.2fs",
                    task.task_id, provider.name, exc, retries, self.settings.max_retries, delay,
                )
                await asyncio.sleep(delay)
                continue
            if probing:
                health.probe_done()
            if health.mark_up():
                log.warning("Provider %s answers again: held tasks resume", provider.name)
                self._send_control("provider.recovered", provider.name, task.agent_name, {})
                self._on_flow_change()
            if job.held:
                job.held = False
                self._send_control("task.released", task.task_id, task.agent_name, {"provider": provider.name})
            return self._succeeded(job, completion)

    def _hold(self, job: Job, provider: Provider, health: ProviderHealth, reason: str, *, alert: bool) -> None:
        if health.mark_down(reason):
            log.warning(
                "Provider %s is unavailable (%s): its tasks are held and intake for its agents pauses "
                "until a probe call succeeds (every %.1fs)",
                provider.name, reason, health.probe_interval,
            )
            self._send_control(
                "alert.provider_down" if alert else "provider.down",
                provider.name, job.task.agent_name, {"reason": reason},
            )
            self._on_flow_change()
        if not job.held:
            job.held = True
            self._send_control("task.held", job.task.task_id, job.task.agent_name, {"provider": provider.name, "reason": reason})

    def _succeeded(self, job: Job, completion: Completion) -> dict[str, Any]:
        return {
            "kind": "succeeded",
            "dispatch": job.dispatch,
            "output": completion.text,
            "source": f"{completion.provider}:{completion.model}",
            "usage": completion.usage.as_dict(),
            "calls": job.calls,
        }

    def _failed(self, job: Job, provider: Provider, exc: Exception) -> dict[str, Any]:
        log.warning("Task %s failed permanently at %s: %s (dead-lettered)", job.task.task_id, provider.name, exc)
        return {
            "kind": "failed",
            "dispatch": job.dispatch,
            "error": str(exc),
            "reason": f"permanent_error: {exc}",
            "source": provider.name,
            "calls": job.calls,
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
