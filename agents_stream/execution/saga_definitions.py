"""Sagas as Python callables: each step an async action, an optional compensation, one pivot.

    REFUND = SagaDefinition("refund", (
        SagaStep("label", create_label, cancel_label),
        SagaStep("refund", refund_payment, pivot=True),
        SagaStep("notify", send_mail),
    ))

An agent whose config names a definition (``saga = "package.module:REFUND"``)
runs every task as that saga; the rules are the pure machine of
``tables/sagas.py``, progress is checkpointed in the task's ledger record
(each step's report, in order), so a re-run replays the reports and goes on
from where the saga was. Actions get a ``StepContext`` whose ``key`` is the
idempotency key to hand to the service they call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from agents_stream.contract.models import TaskPayload
from agents_stream.execution.named import load_named
from agents_stream.tables import sagas as machine

__all__ = ["SagaDefinition", "SagaStep", "StepContext", "load_saga"]


@dataclass(frozen=True)
class StepContext:
    task: TaskPayload
    step: str
    key: str  # idempotency key: the same for every attempt of this action (or compensation)
    attempt: int
    outputs: dict[str, Any] = field(default_factory=dict)  # outputs of the steps done so far
    fencing_token: int = 0  # the task's dispatch number (ToolContext.fencing_token)


Action = Callable[[StepContext], Awaitable[Any]]


@dataclass(frozen=True)
class SagaStep:
    name: str
    action: Action
    compensate: Action | None = None  # None: nothing to undo
    pivot: bool = False
    #: a human approves the task before the saga starts (when the agent has an approval policy)
    approval: bool = False


@dataclass(frozen=True)
class SagaDefinition:
    name: str
    steps: tuple[SagaStep, ...]
    #: bound of one action or compensation call
    timeout_s: float = 30.0
    #: the task's output from its steps' outputs (by step name) once the saga completed; None: those outputs. A
    #: saga that answers a customer (a routed desk's fixed chain) says its answer in words here. Called again on
    #: every re-run from the checkpointed reports: a pure function of them.
    result: Callable[[dict[str, Any]], Any] | None = None

    def __post_init__(self) -> None:
        pivots = [s.name for s in self.steps if s.pivot]
        if len(pivots) > 1:
            raise ValueError(f"saga {self.name!r} has {len(pivots)} pivots {pivots}; at most one")
        self.shape  # validates names  # noqa: B018

    @property
    def needs_approval(self) -> bool:
        return any(s.approval for s in self.steps)

    @property
    def shape(self) -> machine.Saga:
        pivot = next((s.name for s in self.steps if s.pivot), None)
        return machine.Saga(self.name, tuple(s.name for s in self.steps), pivot)

    def step(self, name: str) -> SagaStep:
        return next(s for s in self.steps if s.name == name)


def load_saga(path: str) -> SagaDefinition:
    """``package.module:NAME`` → the SagaDefinition; ValueError saying what is wrong."""
    return load_named(path, SagaDefinition, "saga")
