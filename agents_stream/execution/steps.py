"""Tasks of more than one call: multi-step tasks and sagas, each step checkpointed before the next starts."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from typing import Any, Awaitable, Callable

from agents_stream.config import CONFIDENCE_ORDER
from agents_stream.contract.events import OutcomeEvent, StepDone, TaskFailed, TaskSucceeded
from agents_stream.contract.models import TaskPayload
from agents_stream.execution import run as outcome
from agents_stream.execution.call import SendControl
from agents_stream.execution.ladder import Ladder
from agents_stream.execution.run import Rejected, Run
from agents_stream.execution.saga_definitions import SagaDefinition, StepContext
from agents_stream.resilience.backoff import backoff
from agents_stream.settings import Settings
from agents_stream.tables import sagas as saga_machine

__all__ = ["SendOutcome", "StepRunner", "saga_event", "step_task"]

log = logging.getLogger(__name__)

#: sends one outcome event of a task (keyed by its task_id) to the ledger
SendOutcome = Callable[[str, OutcomeEvent], Awaitable[None]]


class StepRunner:
    """Runs a multi-step task through the ladder step by step, or a saga's actions and compensations."""

    def __init__(
        self,
        settings: Settings,
        ladder: Ladder,
        send_outcome: SendOutcome,
        send_control: SendControl,
        rng: random.Random,
    ) -> None:
        self.settings = settings
        self.ladder = ladder
        self._send_outcome = send_outcome
        self._send_control = send_control
        self._rng = rng

    async def run_steps(self, run: Run) -> TaskSucceeded | TaskFailed | None:
        """A multi-step task: each step's output is checkpointed before the next starts, so a re-run
        (after a crash, a redelivery or a hold) does only the steps not yet done. None: held."""
        task = run.task
        steps = task.steps or []
        last: TaskSucceeded | TaskFailed | None = None
        for index in range(len(run.steps_done), len(steps)):
            run.escalated = None  # each step climbs its own ladder
            last = await self.ladder.answer(run, step_task(task, index, run.steps_done))
            if last is None:
                return None  # held; the steps done so far are kept
            if not isinstance(last, TaskSucceeded) or last.status != "succeeded":
                return last  # a failed or partial step ends the task
            run.steps_done.append(last.output)
            grown = len(json.dumps(run.steps_done, separators=(",", ":")))
            failed = outcome.too_large(run, grown, self.settings.record_max_bytes, last.source)
            if failed is not None:  # its checkpoint would not fit in the task's record: no further step can
                return failed
            if CONFIDENCE_ORDER.index(last.confidence) > CONFIDENCE_ORDER.index(run.steps_confidence):
                run.steps_confidence = last.confidence
            # Durable before the next step starts: a crash from here on does not repeat this one.
            step = StepDone(worker=run.worker, dispatch=run.dispatch, index=index, output=last.output)
            await self._send_outcome(task.task_id, step)
        return TaskSucceeded(
            **outcome.common(run), status="succeeded", partial=False, output=list(run.steps_done),
            confidence=run.steps_confidence, source=last.source if last is not None else "checkpoint",
        )

    async def run_saga(self, run: Run, definition: SagaDefinition) -> TaskSucceeded | TaskFailed:
        """Run the task as a saga. Each report is checkpointed before the next call, so a re-run
        replays the reports and continues; services get the same idempotency key on every attempt."""
        task, shape = run.task, definition.shape
        state, effects = saga_machine.start(shape, task.task_id)
        outputs: dict[str, Any] = {}
        for report in run.steps_done:  # the checkpoint: reports applied before a crash or hold
            state, effects = saga_machine.step(shape, state, saga_event(report))
            if report["event"] == "action_succeeded":
                outputs[report["step"]] = report.get("output")
        announce = not run.steps_done  # the control events of a replay were sent the first time
        while True:
            if announce:
                for effect in effects:
                    if isinstance(effect, saga_machine.Control):
                        details = {"saga": shape.name, **effect.details}
                        self._send_control(effect.event, task.task_id, task.agent_name, details)
            if state.terminal:
                break
            work = next(e for e in effects if isinstance(e, (saga_machine.RunAction, saga_machine.RunCompensation)))
            report = await self._saga_step(run, definition, work, outputs)
            step = StepDone(worker=run.worker, dispatch=run.dispatch, index=len(run.steps_done), output=report)
            await self._send_outcome(task.task_id, step)
            run.steps_done.append(report)
            announce = True
            if report["event"] == "action_succeeded":
                outputs[work.step] = report["output"]
            state, effects = saga_machine.step(shape, state, saga_event(report))
        if state.status == saga_machine.COMPLETED:
            return TaskSucceeded(
                **outcome.common(run), status="succeeded", partial=False,
                output=definition.result(outputs) if definition.result else outputs, confidence="high",
                source=f"saga:{shape.name}",
            )
        return outcome.rejected(run, Rejected(
            f"saga_compensated: {state.error}",
            f"saga {shape.name} failed before its pivot ({state.error}); undone: {list(state.undone)}",
            f"saga:{shape.name}",
        ))

    async def _saga_step(
        self, run: Run, definition: SagaDefinition, work: saga_machine.RunAction | saga_machine.RunCompensation,
        outputs: dict[str, Any],
    ) -> dict[str, Any]:
        """One action or compensation the machine asked for (``work``), as the report to checkpoint."""
        task, shape = run.task, definition.shape
        compensating = isinstance(work, saga_machine.RunCompensation)
        step = definition.step(work.step)
        fn = step.compensate if compensating else step.action
        if work.attempt > 1:
            settings = self.settings
            await asyncio.sleep(backoff(
                work.attempt - 1, base=settings.backoff_base_s, cap=settings.backoff_cap_s, rng=self._rng,
            ))
        ctx = StepContext(task=task, step=work.step, key=work.key, attempt=work.attempt, outputs=dict(outputs),
                          fencing_token=run.dispatch)
        kind = "compensation" if compensating else "action"
        try:
            output = await asyncio.wait_for(fn(ctx), definition.timeout_s) if fn is not None else None
            return {"event": f"{kind}_succeeded", "step": work.step, "output": output}
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the machine decides: compensate, or retry the same key
            log.info("Task %s: saga %s %s %s failed (attempt %d): %s",
                     task.task_id, shape.name, kind, work.step, work.attempt, exc)
            return {"event": f"{kind}_failed", "step": work.step, "error": str(exc)[:500]}


def saga_event(report: dict[str, Any]) -> saga_machine.Event:
    """A checkpointed saga report as the machine's event."""
    event, step, error = report["event"], report["step"], report.get("error", "")
    events: dict[str, Callable[[], saga_machine.Event]] = {
        "action_succeeded": lambda: saga_machine.ActionSucceeded(step),
        "action_failed": lambda: saga_machine.ActionFailed(step, error),
        "compensation_succeeded": lambda: saga_machine.CompensationSucceeded(step),
        "compensation_failed": lambda: saga_machine.CompensationFailed(step, error),
    }
    return events[event]()


def step_task(task: TaskPayload, index: int, done: list[Any]) -> TaskPayload:
    """Step ``index`` of a multi-step task as a task of its own, with the outputs of the steps done as context."""
    step = (task.steps or [])[index]
    text = step.get("instruction", json.dumps(step)) if isinstance(step, dict) else str(step)
    instruction = f"{task.instruction}\n\nStep {index + 1} of {len(task.steps or [])}: {text}"
    context = {**task.context_data, "previous_steps": done} if done else dict(task.context_data)
    return task.model_copy(update={"instruction": instruction, "context_data": context, "steps": None})
