"""A framework agent's task on the executor (agents_stream/frameworks/runner.py), without I/O: its journal entries as
outcomes, its end as the task's result, and what each kind of failure becomes."""

from __future__ import annotations

from typing import Any

import pytest

from agents_stream.contract.errors import Fenced
from agents_stream.contract.events import JournalEntry, TaskFailed, TaskSucceeded
from agents_stream.contract.models import TaskPayload
from agents_stream.execution.run import Run
from agents_stream.frameworks.durable import DurableRun, JournalMismatch, ModelTurn, ToolOutcome
from agents_stream.frameworks.runner import FrameworkRunner
from agents_stream.settings import Settings


class Ladder:
    def __init__(self) -> None:
        self.held: list[str] = []
        self.released = 0

    def hold(self, run: Run, reason: str) -> None:
        self.held.append(reason)

    def release(self, run: Run) -> None:
        self.released += 1


class Down(Exception):
    """The model's endpoint did not answer."""


class Scripted:
    """A framework agent: one tool call, then the answer; or the error it is given."""

    framework = "fw"
    name = "support"
    version = "fw 1+abc"

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error
        self.prompts: list[str] = []

    async def run(self, prompt: str, durable: DurableRun) -> Any:
        self.prompts.append(prompt)
        if self.error is not None:
            raise self.error
        await durable.model_request(_ask(ModelTurn({"call": "c1"}, calls=({"id": "c1", "name": "refund",
                                                                            "arguments": {}},), source="fw:m",
                                                   input_tokens=10, output_tokens=2)))
        await durable.tool_call("c1", "refund", {}, _refund)
        await durable.model_request(_ask(ModelTurn({"text": "done"}, text="done", source="fw:m", input_tokens=12,
                                                   output_tokens=3)))
        return {"answer": "done"}

    def unavailable(self, exc: BaseException) -> str | None:
        return "it did not answer" if isinstance(exc, Down) else None


def _ask(turn: ModelTurn) -> Any:
    async def ask() -> ModelTurn:
        return turn
    return ask


async def _refund() -> ToolOutcome:
    return ToolOutcome({"refunded": True})


def setup(agent: Scripted) -> tuple[FrameworkRunner, Run, Ladder, list[Any]]:
    sent: list[Any] = []

    async def send(task_id: str, event: Any) -> None:
        sent.append(event)

    ladder = Ladder()
    runner = FrameworkRunner(Settings(), ladder, send, None)  # type: ignore[arg-type]
    task = TaskPayload(task_id="t-1", agent_name="support", instruction="refund o-1", context_data={"order": "o-1"})
    return runner, Run(task=task, dispatch=4, worker="w1"), ladder, sent


async def test_each_entry_is_an_outcome_and_the_agents_output_is_the_result_with_its_transcript_and_usage() -> None:
    agent = Scripted()
    runner, run, ladder, sent = setup(agent)
    ended = await runner.run(run, None, agent)  # type: ignore[arg-type]
    assert isinstance(ended, TaskSucceeded) and ended.output == {"answer": "done"}
    assert agent.prompts == ['[task_id=t-1]\nrefund o-1\n\nContext (JSON):\n{"order": "o-1"}']
    assert [(e.index, e.dispatch, e.output["kind"]) for e in sent] == [(0, 4, "turn"), (1, 4, "tool"), (2, 4, "turn")]
    assert all(isinstance(e, JournalEntry) for e in sent)
    assert (ended.usage.input_tokens, ended.usage.output_tokens, ended.calls) == (22, 5, 2)
    assert ended.transcript is not None and [t["tool_calls"] for t in ended.transcript["turns"]] == [["refund"], []]
    assert ended.source == "fw:m" and ladder.released == 1


@pytest.mark.parametrize("error, reason", [
    (JournalMismatch("turn 0 of the journal was written by another framework"), "agent_upgrade"),
    (ValueError("the agent's output did not validate"), "framework_error"),
])
async def test_a_journal_that_does_not_fit_or_a_framework_error_ends_the_task(error: Exception, reason: str) -> None:
    runner, run, _, _ = setup(agent := Scripted(error))
    ended = await runner.run(run, None, agent)  # type: ignore[arg-type]
    assert isinstance(ended, TaskFailed) and ended.reason == reason and str(error) in ended.error


async def test_a_model_that_does_not_answer_holds_the_task() -> None:
    runner, run, ladder, sent = setup(agent := Scripted(Down("connection refused")))
    assert await runner.run(run, None, agent) is None  # type: ignore[arg-type]
    assert ladder.held and "cannot reach its model (it did not answer)" in ladder.held[0]
    assert run.wait == Settings().probe_interval_s and sent == []


async def test_a_fenced_run_stops_as_fenced_even_inside_the_frameworks_exception_group() -> None:
    wrapped = ExceptionGroup("tool calls", [Fenced("this worker left the group")])
    runner, run, _, _ = setup(agent := Scripted(wrapped))
    with pytest.raises(Fenced):
        await runner.run(run, None, agent)  # type: ignore[arg-type]
