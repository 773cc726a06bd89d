"""The executor: a pool of call slots that runs dispatched tasks and reports outcomes and heartbeats; no table access.

The ledger hands a task over with ``dispatch``; a free slot runs it (the
ladder, ``agents_stream.execution.ladder``; steps and sagas,
``agents_stream.execution.steps``) and reports the outcome as an event on the
outcomes topic, which the ledger applies. While a task is here its lease is
renewed by heartbeat events. A held task leaves its slot and waits in memory
until a circuit changes. Every call goes through the shared circuits
(``agents_stream.resilience.circuits``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from mode import Service

from agents_stream.background import abandon
from agents_stream.config import AppConfig
from agents_stream.contract.errors import Fenced, Interrupted
from agents_stream.contract.events import (
    CachedAnswer,
    CallParked,
    CallsDelegated,
    Heartbeat,
    JournalEntry,
    LeaseExpired,
    OutcomeEvent,
    StepDone,
    TaskFailed,
    TaskSucceeded,
)
from agents_stream.contract.models import TaskPayload
from agents_stream.execution import outage
from agents_stream.execution import run as run_outcome
from agents_stream.execution.acting import AgentRunner
from agents_stream.execution.call import Caller, SendControl
from agents_stream.execution.chunks import Chunks, SendEvent
from agents_stream.execution.handlers import Handlers
from agents_stream.execution.ladder import Ladder, LookupFn
from agents_stream.execution.mcp_servers import McpServers, ensure_sdk
from agents_stream.execution.membership import Membership
from agents_stream.execution.plan import AgentPlan, mcp_servers
from agents_stream.execution.prober import Prober
from agents_stream.execution.run import Run
from agents_stream.execution.steps import SendOutcome, StepRunner
from agents_stream.execution.summary import Summariser
from agents_stream.frameworks.runner import FrameworkRunner
from agents_stream.ops import metrics
from agents_stream.providers.base import Provider
from agents_stream.resilience.circuits import Circuits
from agents_stream.settings import Settings

__all__ = ["Executor", "LookupFn", "Outlets", "SendControl", "SendOutcome"]

log = logging.getLogger(__name__)

#: how long stop() waits for cancelled slots, and for each provider to close
_CLOSE_S = 5.0
#: what a run reports of its own work (not its heartbeats or its release): fenced once the worker joined again
_OF_A_RUN = (JournalEntry, StepDone, CallParked, CallsDelegated, TaskSucceeded, TaskFailed)


@dataclass(frozen=True)
class Outlets:
    """Where the executor's runs send what they report: each outcome to the ledger (``send_outcome``), control
    events, a round's streamed text (``send_event``; None: not streamed), cache lookups (None: no cache), and the
    flow, told when a change of the held or queued runs changes what may be read (``on_flow_change``)."""

    send_outcome: SendOutcome
    send_control: SendControl
    on_flow_change: Callable[[], None]
    cache_lookup: LookupFn | None = None
    send_event: SendEvent | None = None


class Executor(Service):
    """Runs dispatched tasks in ``max_in_flight`` call slots; ``stop()`` drains them within ``grace_s``."""

    mundane_level = "debug"  # mode's "Starting..."/"Stopping..." lines: the worker logs its own

    def __init__(
        self,
        settings: Settings,
        config: AppConfig,
        plans: dict[str, AgentPlan],
        circuits: Circuits,
        outlets: Outlets,
        worker_id: str,
        rng: random.Random | None = None,
        grace_s: float | None = None,
        membership: Membership | None = None,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.config = config
        self.plans = plans
        self.circuits = circuits
        self.worker_id = worker_id
        #: how long stop() lets running calls finish (default: AGENTS_STREAM_SHUTDOWN_GRACE_S)
        self.grace_s = settings.shutdown_grace_s if grace_s is None else grace_s
        send_control, on_flow_change = outlets.send_control, outlets.on_flow_change
        self._send_any = outlets.send_outcome
        send_outcome = self._send_outcome
        self._on_flow_change = on_flow_change
        rng = rng or random.Random()
        # a round's text streams to agent.conversation.events as the model writes it (execution/chunks.py)
        send_event = outlets.send_event
        chunks = Chunks(send_event, settings.partitions) if send_event is not None and settings.stream_text else None
        #: whether a run may still act here (None: always): stamped on each run at dispatch
        self.membership = membership
        self.caller = Caller(settings, config, circuits, send_control, rng, chunks, membership)
        self.ladder = Ladder(settings, plans, circuits, self.caller, send_control, on_flow_change, outlets.cache_lookup)
        # a routed agent's handler runs on the same runners; its journal entries go where its part of the journal is
        self.handlers = Handlers(self.caller, plans, send_outcome, self._run_plan)
        self.step_runner = StepRunner(settings, self.ladder, self.handlers.send, send_control, rng)
        self.agent_runner = AgentRunner(settings, self.ladder, self.caller, self.handlers.send, send_control, rng)
        self.framework_runner = FrameworkRunner(settings, self.ladder, self.handlers.send, membership)
        self.summariser = Summariser(self.caller, send_outcome)
        self.prober = Prober(circuits, self._providers())
        servers = mcp_servers(plans)
        if servers:
            ensure_sdk(sorted(servers))
        #: the MCP servers of this worker's agents (None: no agent names one)
        self.mcp = McpServers(servers, plans, send_control=send_control, on_change=on_flow_change,
                              rng=rng) if servers else None
        self.runs: dict[str, Run] = {}  # task_id → its run, queued, running or held
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._own: set[asyncio.Future[Any]] = set()  # slots, held runs' waits, heartbeats: stop() ends them
        self._accepting = True
        self.running = 0

    @property
    def held(self) -> int:
        """Runs held now (nothing of their ladder available)."""
        return self.ladder.held

    # -- the ledger's side ------------------------------------------------

    def has(self, task_id: str) -> bool:
        return task_id in self.runs

    def dispatch(
        self, task: TaskPayload, dispatch: int, steps_done: list[Any] | None = None, trace: str | None = None,
    ) -> None:
        """Queue a task (with the steps it has done, for a multi-step one; ``trace``: the traceparent its spans hang
        under); a free call slot picks it up. Never blocks the ledger."""
        if task.task_id in self.runs or not self._accepting:
            return
        run = Run(task, dispatch, self.worker_id, steps_done=list(steps_done or []), trace=trace)
        if self.membership is not None:
            self.membership.stamp(run)
        self.runs[task.task_id] = run
        self._queue.put_nowait(task.task_id)
        if self._queue.qsize() == self.settings.max_queued:
            self._on_flow_change()  # the queue just filled: pause intake

    def interrupt(self, task_id: str) -> None:
        """A conversation's round running here stops at its next safe point and is dispatched again with the new
        message (an agent loop checks between steps; any other run finishes as it is)."""
        run = self.runs.get(task_id)
        if run is not None:
            run.interrupted = True

    def cancel(self, task_id: str) -> None:
        """The task was cancelled: stop its run here, queued, held or calling (a call in flight is aborted; a tool
        running in a thread finishes on its own, its result unused). No outcome is sent for it."""
        run = self.runs.get(task_id)
        if run is None:
            return  # it ran elsewhere, or finished: its outcome, if one comes, changes nothing
        run.cancelled = True
        if run.work is not None and not run.work.done():
            run.work.cancel()  # the slot ends the run (_serve) and takes the next task
            return
        self.runs.pop(task_id, None)  # queued or held: the slot or the hold's waiter finds it gone
        self.ladder.forget(run)
        run.done.set()
        log.info("Task %s was cancelled before its run here started (or while it was held): it will not run", task_id)

    def blocked(self, agent: str) -> bool:
        """True while the agent should take no new tasks: nothing it may use is available, or the queue is full."""
        if self._queue.qsize() >= self.settings.max_queued:
            return True
        plan = self.plans.get(agent)
        if plan is None:
            return False
        if self.ladder.budget_holds(plan):
            return True
        if self.mcp is not None and self.mcp.holds(plan):
            return True  # an MCP server of its agent was never listed: its tools are not known yet
        if plan.partial or plan.cache:
            return False  # it can still answer, from the cache or with the partial result
        if plan.config.handoff_after_s is not None:
            return False  # its rounds end with the handoff to a person: messages and operators' actions must flow
        return not any(self.circuits.available(t.provider.name)[0] for t in plan.tiers)

    def cache_answer(self, task_id: str, answer: CachedAnswer | None) -> None:
        """The ledger relays the cache's reply to a lookup this worker made."""
        self.ladder.cache_answer(task_id, answer)

    # -- lifecycle (mode.Service) ---------------------------------------------

    async def on_start(self) -> None:
        for _ in range(self.settings.max_in_flight):
            self._spawn(self._slot())
        self._spawn(self._heartbeats())
        self._spawn(self.prober.run())  # a breaker past its open timeout is probed without waiting for a task
        if self.membership is not None:  # a stall of this loop is noticed even while no run calls
            self._spawn(self.membership.watch())
        if self.mcp is not None:  # connects and lists in the background: a server that is down holds its agents only
            self._spawn(self.mcp.run())

    def _spawn(self, coro: Awaitable[None]) -> None:
        fut = self.add_future(coro)
        self._own.add(fut)
        fut.add_done_callback(self._own.discard)

    async def on_stop(self) -> None:
        """Take nothing new; let running calls finish within ``grace_s``; cancel the rest.

        What is cancelled keeps its uncommitted offset and its lease: another
        worker (or this one, restarted) takes it over when the lease lapses.
        """
        self._accepting = False
        while not self._queue.empty():
            self.runs.pop(self._queue.get_nowait(), None)
        await self._drain(self.grace_s)
        for fut in list(self._own):
            fut.cancel()
        if self._own:
            await asyncio.wait(list(self._own), timeout=_CLOSE_S)
        await self._close_providers()

    async def _drain(self, grace: float) -> None:
        running = [r.done.wait() for r in self.runs.values() if r.started is not None and not r.held]
        if not running:
            return
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

    def _providers(self) -> dict[str, Provider]:
        """Every provider of this worker's plans, by name."""
        plans = self.plans.values()
        providers: dict[str, Provider] = {t.provider.name: t.provider for plan in plans for t in plan.tiers}
        providers.update({p.name: p for plan in plans for p in (plan.light, plan.classifier, plan.summarizer) if p})
        return providers

    async def _close_providers(self) -> None:
        for provider in self._providers().values():
            try:
                await asyncio.wait_for(provider.close(), timeout=_CLOSE_S)
            except Exception as exc:  # closing is best effort on the way out
                log.warning("Could not close provider %s cleanly: %r", provider.name, exc)

    # -- the call slots ------------------------------------------------------

    async def _slot(self) -> None:
        while True:
            task_id = await self._queue.get()  # idle slots wait here; stop() cancels them
            run = self.runs.get(task_id)
            if run is None:
                continue
            if self._queue.qsize() == self.settings.max_queued - 1:
                self._on_flow_change()  # room again: resume intake
            await self._serve(run)

    async def _serve(self, run: Run) -> None:
        """Run one task to its outcome and report it, or hold it off the slots when no rung is available."""
        task_id = run.task.task_id
        self.running += 1
        if run.started is None:
            run.started = time.monotonic()
        held = False
        try:
            run.work = asyncio.ensure_future(self._run(run))
            try:
                outcome = await run.work
            finally:
                run.work = None
            if outcome is None and run.held:  # held past the agent's handoff_after_s: a person takes over
                outcome = outage.handed_over(run, self.plans[run.task.agent_name].config)
                if outcome is not None:
                    self.ladder.release(run)
            if outcome is None:
                # Held: give the slot back to other work; come back when a circuit changes.
                held = True
                self._spawn(self._hold(run))
            elif isinstance(outcome, CallParked | CallsDelegated):  # it waits in the ledger for a human or sub-tasks
                await self._send_outcome(task_id, outcome)
            else:
                outcome = run_outcome.within(run, outcome, self.settings.record_max_bytes)
                status: str
                confidence: str
                if isinstance(outcome, TaskSucceeded):
                    status, confidence = outcome.status, outcome.confidence
                else:  # a failure's labels: its kind as the status, "failed" as the confidence
                    status, confidence = outcome.kind, "failed"
                metrics.answers.labels(run.task.agent_name, status, outcome.source.split(":")[0], confidence).inc()
                await self._send_final(task_id, outcome, run)
        except asyncio.CancelledError:
            if not run.cancelled or self._stopping():
                raise
            log.info("Task %s was cancelled while it ran here: its run is stopped and sends no outcome", task_id)
        except Interrupted:
            log.info("Task %s (dispatch %d) stops at a safe point for its conversation's new message; it is "
                     "dispatched again with it", task_id, run.dispatch)
            self._spawn(self._release(task_id, run.dispatch, interrupted=True))
        except Fenced as exc:
            log.warning(
                "Task %s (dispatch %d) is fenced: it stops here without acting on its last step: %s. The partition's "
                "owner takes it over from its journal; nothing to do unless this repeats (check this worker's "
                "connection to the brokers and its pauses)", task_id, run.dispatch, exc,
            )
            self._spawn(self._release(task_id, run.dispatch))
        except Exception as exc:  # a bug here must not kill the slot; the lease recovers the task
            log.exception(
                "Executor failed on task %s (its lease will lapse and it will be re-dispatched): %r", task_id, exc,
            )
        finally:
            self.running -= 1
            if not held:
                self.ladder.forget(run)
                run.done.set()
                self.runs.pop(task_id, None)

    async def _send_final(self, task_id: str, outcome: TaskSucceeded | TaskFailed, run: Run) -> None:
        """Send a run's final outcome. The final answer's journal entry the agent loop held back (``run.final_entry``)
        goes just ahead of it, not awaited: applied here, both change the task's record in the same loop turn and
        reach the changelog as one record, the finished one (one broker round trip where there were two); on the
        outcomes topic they go in order. The entry's own confirmation is awaited after the outcome went."""
        entry, run.final_entry = run.final_entry, None
        if entry is None:
            await self._send_outcome(task_id, outcome)
            return
        journaled = asyncio.ensure_future(self._send_outcome(task_id, entry))
        try:
            await asyncio.sleep(0)  # the entry's send takes its first step, its apply, ahead of the outcome's
            await self._send_outcome(task_id, outcome)
            await journaled  # bounded: the route waits for an entry to be durable for JOURNAL_DURABLE_S at most
        finally:
            abandon(journaled)  # settled by now unless the outcome's send raised: that error is the one raised

    async def _send_outcome(self, task_id: str, outcome: OutcomeEvent) -> None:
        """Send an outcome to the ledger; an outcome of a run of this worker (a journal entry, a checkpoint, a
        parked call, delegated calls, the final) raises ``Fenced`` instead when the worker joined the group again
        since the run was dispatched (``Membership.verify_outcome``). Its release and heartbeats always go."""
        if self.membership is not None and isinstance(outcome, _OF_A_RUN):
            run = self.runs.get(task_id)
            if run is not None and run.dispatch == outcome.dispatch:
                self.membership.verify_outcome(run)
        await self._send_any(task_id, outcome)

    def _stopping(self) -> bool:
        """The slot itself is being cancelled (stop), not only the run it was awaiting."""
        current = asyncio.current_task()
        return current is not None and current.cancelling() > 0

    async def _hold(self, run: Run) -> None:
        """A held task waits here, off the call slots (its lease is still renewed), then queues again."""
        await self.circuits.wait_change(run.wait)
        if self._accepting and self.runs.get(run.task.task_id) is run:
            self._queue.put_nowait(run.task.task_id)

    async def _run(self, run: Run) -> TaskSucceeded | TaskFailed | CallParked | CallsDelegated | None:
        """The task's outcome, or None when it must hold (``run.wait`` says for how long at most)."""
        plan = self.plans[run.task.agent_name]
        if plan.saga is None and plan.config.summary is not None and run.task.conversation is not None:
            await self.summariser.ensure(run, plan)  # a round: its summary first
        if plan.routing is not None:  # a routed agent: the handler its route picks (execution/handlers.py)
            return await self.handlers.run(run, plan)
        return await self._run_plan(run, plan, final_with_outcome=True)

    async def _run_plan(
        self, run: Run, plan: AgentPlan, *, final_with_outcome: bool = False,
    ) -> TaskSucceeded | TaskFailed | CallParked | CallsDelegated | None:
        """The run's task as ``plan``'s: a saga, an agent loop, steps, or one answer up the ladder.
        ``final_with_outcome``: an agent loop's final answer entry goes with the run's final outcome
        (``_send_final``); not for a routed agent's handler, whose outcome its route may still escalate."""
        if plan.saga is not None:
            return await self.step_runner.run_saga(run, plan.saga)
        if plan.framework is not None:
            return await self.framework_runner.run(run, plan, plan.framework)
        if plan.agent is not None:
            agent = self.mcp.agent_for(plan) if self.mcp is not None and plan.mcp else plan.agent
            if isinstance(agent, str):  # its MCP tools are not known yet: hold, as with no provider available
                self.ladder.hold(run, agent)
                run.wait = self.settings.probe_interval_s
                return None
            return await self.agent_runner.run(run, plan, agent, final_with_outcome=final_with_outcome)
        if not run.task.steps:
            return await self.ladder.answer(run, run.task)
        return await self.step_runner.run_steps(run)

    async def _release(self, task_id: str, dispatch: int, interrupted: bool = False) -> None:
        """Tell the partition's owner that the run of ``dispatch`` stopped without an outcome, so it takes the
        task over now instead of waiting out the lease (a lost release only costs that wait)."""
        await asyncio.sleep(0)  # after the slot let go of the run: the owner may be this worker's own ledger
        try:
            await self._send_outcome(task_id, LeaseExpired(dispatch=dispatch, worker=self.worker_id, released=True,
                                                           interrupted=interrupted or None))
        except Exception as exc:
            log.warning("Task %s: the release of dispatch %d was not sent (%r); its lease lapses instead",
                        task_id, dispatch, exc)

    def beat_now(self) -> None:
        """Renew every running task's lease now (after a rebalance: the new owner of a moved partition learns at
        once that its tasks' runs go on here, and leaves them to finish)."""
        self._spawn(self._beat())

    async def _beat(self) -> None:
        for task_id, run in list(self.runs.items()):
            beat = Heartbeat(worker=self.worker_id, dispatch=run.dispatch, owner=self.worker_id)
            try:
                await self._send_outcome(task_id, beat)
            except Exception as exc:  # the regular beats follow; the lease has slack for that
                log.warning("Heartbeat for %s not sent (%r); retrying next round", task_id, exc)

    async def _heartbeats(self) -> None:
        # Not self.sleep()/should_stop: the leases of running calls must be renewed through stop()'s grace period.
        interval = max(0.2, self.settings.lease_ttl_s / 3.0)
        while True:
            await asyncio.sleep(interval)
            await self._beat()
