"""The saga state machine: steps with compensations and a pivot, pure and clock-free.

    RUNNING ──step fails before the pivot──► COMPENSATING ──all undone──► COMPENSATED
       │                                        (compensations of the done steps, newest first,
       │                                         each retried until it succeeds)
       ├──step fails at or after the pivot's success──► RUNNING (the same step again: retried to completion)
       └──last step succeeds──► COMPLETED

The pivot is the step after which the saga can only go forward (the refund in
the support example: once money moved, the label is not cancelled). A failure
of the pivot itself is a failure before the pivot: its action did not happen.
Every action and compensation carries an idempotency key that stays the same
across retries, so a service that saw it once does nothing the second time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

RUNNING = "running"
COMPENSATING = "compensating"
COMPLETED = "completed"
COMPENSATED = "compensated"
TERMINAL = frozenset({COMPLETED, COMPENSATED})


@dataclass(frozen=True)
class Saga:
    """The shape of a saga: its step names in order, and which one is the pivot (or none)."""

    name: str
    steps: tuple[str, ...]
    pivot: str | None = None

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError(f"saga {self.name!r} has no steps")
        if len(set(self.steps)) != len(self.steps):
            raise ValueError(f"saga {self.name!r} names a step twice: {self.steps}")
        if self.pivot is not None and self.pivot not in self.steps:
            raise ValueError(f"saga {self.name!r}: pivot {self.pivot!r} is not one of its steps {self.steps}")


@dataclass(frozen=True)
class SagaState:
    saga_id: str
    status: str = RUNNING
    done: tuple[str, ...] = ()  # steps whose action succeeded, in order
    undone: tuple[str, ...] = ()  # steps whose compensation succeeded, in order
    attempt: int = 1  # of the action or compensation now due
    pivoted: bool = False
    error: str | None = None  # what made it compensate

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


# Events: what the saga runner reports.
@dataclass(frozen=True)
class ActionSucceeded:
    step: str


@dataclass(frozen=True)
class ActionFailed:
    step: str
    error: str


@dataclass(frozen=True)
class CompensationSucceeded:
    step: str


@dataclass(frozen=True)
class CompensationFailed:
    step: str
    error: str


Event = ActionSucceeded | ActionFailed | CompensationSucceeded | CompensationFailed


# Effects: what the runner must do next.
@dataclass(frozen=True)
class RunAction:
    step: str
    key: str  # idempotency key: the same for every attempt
    attempt: int


@dataclass(frozen=True)
class RunCompensation:
    step: str
    key: str
    attempt: int


@dataclass(frozen=True)
class Control:
    event: str  # saga.step_done, saga.pivoted, saga.compensating, saga.compensated, saga.completed, saga.retrying
    details: dict[str, Any]


Effect = RunAction | RunCompensation | Control


def action_key(saga_id: str, step: str) -> str:
    return f"{saga_id}:{step}"


def compensation_key(saga_id: str, step: str) -> str:
    return f"{saga_id}:{step}:compensate"


def start(saga: Saga, saga_id: str) -> tuple[SagaState, list[Effect]]:
    first = saga.steps[0]
    return SagaState(saga_id), [RunAction(first, action_key(saga_id, first), 1)]


def due(saga: Saga, state: SagaState) -> str | None:
    """The step whose action (running) or compensation (compensating) is awaited; None when terminal."""
    if state.status == RUNNING:
        return saga.steps[len(state.done)]
    if state.status == COMPENSATING:
        return _to_undo(state)[0] if _to_undo(state) else None
    return None


def _to_undo(state: SagaState) -> list[str]:
    return [s for s in reversed(state.done) if s not in state.undone]


def step(saga: Saga, state: SagaState, event: Event) -> tuple[SagaState, list[Effect]]:
    """Apply one report. A report about anything but the step now due (a duplicate, a late retry) changes nothing."""
    if state.terminal or event.step != due(saga, state):
        return state, []
    sid = state.saga_id
    if isinstance(event, ActionSucceeded) and state.status == RUNNING:
        done = (*state.done, event.step)
        pivoted = state.pivoted or event.step == saga.pivot
        effects: list[Effect] = [Control("saga.step_done", {"step": event.step, "attempt": state.attempt})]
        if event.step == saga.pivot:
            effects.append(Control("saga.pivoted", {"step": event.step}))
        if len(done) == len(saga.steps):
            effects.append(Control("saga.completed", {"steps": list(done)}))
            return replace(state, status=COMPLETED, done=done, attempt=1, pivoted=pivoted), effects
        nxt = saga.steps[len(done)]
        effects.append(RunAction(nxt, action_key(sid, nxt), 1))
        return replace(state, done=done, attempt=1, pivoted=pivoted), effects
    if isinstance(event, ActionFailed) and state.status == RUNNING:
        if state.pivoted:
            # Past the point of no return: the same step again, with the same key, until it succeeds.
            attempt = state.attempt + 1
            return replace(state, attempt=attempt), [
                Control("saga.retrying", {"step": event.step, "attempt": attempt, "error": event.error}),
                RunAction(event.step, action_key(sid, event.step), attempt),
            ]
        compensating = replace(state, status=COMPENSATING, attempt=1, error=f"{event.step}: {event.error}")
        details = {"failed_step": event.step, "error": event.error, "undo": _to_undo(compensating)}
        effects = [Control("saga.compensating", details)]
        return _next_compensation(compensating, effects)
    if isinstance(event, CompensationSucceeded) and state.status == COMPENSATING:
        undone = replace(state, undone=(*state.undone, event.step), attempt=1)
        return _next_compensation(undone, [Control("saga.step_undone", {"step": event.step})])
    if isinstance(event, CompensationFailed) and state.status == COMPENSATING:
        attempt = state.attempt + 1
        return replace(state, attempt=attempt), [
            Control(
                "saga.retrying", {"step": event.step, "attempt": attempt, "error": event.error, "compensation": True}
            ),
            RunCompensation(event.step, compensation_key(sid, event.step), attempt),
        ]
    return state, []


def _next_compensation(state: SagaState, effects: list[Effect]) -> tuple[SagaState, list[Effect]]:
    left = _to_undo(state)
    if not left:
        effects.append(Control("saga.compensated", {"undone": list(state.undone), "error": state.error}))
        return replace(state, status=COMPENSATED), effects
    effects.append(RunCompensation(left[0], compensation_key(state.saga_id, left[0]), state.attempt))
    return state, effects
