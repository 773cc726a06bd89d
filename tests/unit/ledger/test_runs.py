"""The seam between the ledger and the executor (``agents_stream.ledger.runs.Runs``): mypy finds that the worker's
executor and the unit tests' FakeRuns both are what the ledger needs, and that a stand-in missing a part is not."""

from __future__ import annotations

SEAM = """
from agents_stream.execution.executor import Executor
from agents_stream.ledger.runs import Runs
from tests.unit.ledger_fakes import FakeRuns


class WithoutCancel:
    worker_id = "w1"

    def has(self, task_id: str) -> bool:
        return False


def executor(e: Executor) -> Runs:
    return e


def fake(f: FakeRuns) -> Runs:
    return f


def partial(w: WithoutCancel) -> Runs:
    return w


reveal_type(executor)
reveal_type(fake)
"""


def test_the_executor_and_the_fake_are_the_runs_the_ledger_needs(seam_holds) -> None:
    seam_holds(SEAM, real="agents_stream.execution.executor.Executor", fake="tests.unit.ledger_fakes.FakeRuns",
               refused="WithoutCancel", seam="Runs")


ROUTE_SEAM = """
from agents_stream.ledger.ledger import Ledger
from agents_stream.ledger.route import AppliesHere
from tests.unit.ledger_fakes import NotHolding


class WithoutApplyHere:
    def handle(self, event: object) -> None: ...


def ledger(led: Ledger) -> AppliesHere:
    return led


def fake(f: NotHolding) -> AppliesHere:
    return f


def partial(w: WithoutApplyHere) -> AppliesHere:
    return w


reveal_type(ledger)
reveal_type(fake)
"""


def test_the_ledger_and_the_fake_are_what_the_outcome_route_needs(seam_holds) -> None:
    """The route (ledger/route.py) needs of the ledger only apply_here: the Ledger and NotHolding both are it."""
    seam_holds(ROUTE_SEAM, real="agents_stream.ledger.ledger.Ledger", fake="tests.unit.ledger_fakes.NotHolding",
               refused="WithoutApplyHere", seam="AppliesHere")
