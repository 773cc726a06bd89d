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


def test_the_executor_and_the_fake_are_the_runs_the_ledger_needs(mypy_lines) -> None:
    lines = mypy_lines(SEAM)
    notes = [line for line in lines if "Revealed type" in line]
    assert "agents_stream.execution.executor.Executor" in notes[0], lines  # found, not Any
    assert "tests.unit.ledger_fakes.FakeRuns" in notes[1], lines
    errors = [line for line in lines if line.startswith("error")]
    assert len(errors) == 1, lines
    assert 'Incompatible return value type (got "WithoutCancel", expected "Runs")' in errors[0], lines
