"""Agents as tools in the ledger: a delegation publishes sub-tasks and parks the caller; a sub-task's end, with a
result or dead-lettered without one, goes back to its caller's outcomes topic; the last result dispatches it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents_stream.tables import leases
from agents_stream.tables.definitions import Tables
from faust.types import TP

from agents_stream.contract import topics
from agents_stream.contract.events import OUTCOMES, CallsDelegated, LeaseExpired, SubtaskResult, decode, encode
from agents_stream.contract.models import ParentRef, TaskPayload
from agents_stream.execution import run as outcome
from agents_stream.execution.run import Rejected, Run
from agents_stream.ledger.ledger import Ledger
from agents_stream.ops.notify import Notifier
from agents_stream.settings import Settings
from tests.unit.ledger_fakes import FakeRuns, Table, faust_event, recording_outbox

SETTINGS = Settings()
MINE = topics.outcomes_topic(SETTINGS.app_id)
LEAD = TaskPayload(task_id="lead-1", agent_name="lead", instruction="report", deadline="2026-12-02T00:00:00Z")
SUB = TaskPayload(task_id="lead-1/c1", agent_name="analyzer", instruction="analyse",
                  parent=ParentRef(task_id="lead-1", app_id="caller-app", call_id="c1", lineage=["lead"]))


async def _spin() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def _ledger(task: TaskPayload, *, state: str = leases.RUNNING, dispatch: int = 1, lease_until: float = 1e12,
            waiting: str | None = None) -> tuple[Ledger, Table, Table, list[tuple[str, bytes | None]], list[Any]]:
    outbox, sent = recording_outbox()
    tasks, timers = Table(), Table()
    runs = FakeRuns()
    dispatched = runs.dispatched
    ledger = Ledger(SETTINGS, executor=runs, worker_id="w1",
                    tables=Tables(tasks=tasks, answers=Table(), jobs=Table(), timers=timers),
                    watermark=outbox.watermark, outbox=outbox, notifier=Notifier())
    record = leases.TaskRecord(
        state=state, agent=task.agent_name, dispatch=dispatch, owner="w2", lease_until=lease_until,
        payload=task.model_dump_json(), topic=topics.task_topic(task.agent_name), partition=0, offset=4,
        received_at=0.0, waiting=waiting,
    )
    tasks[task.task_id] = record.to_json()
    return ledger, tasks, timers, sent, dispatched


async def test_a_delegation_publishes_the_subtasks_and_parks_the_caller() -> None:
    ledger, tasks, timers, sent, _ = _ledger(LEAD)
    event = CallsDelegated(worker="w2", dispatch=1, turn=0, calls=[
        {"id": "c1", "agent": "analyzer", "instruction": "analyse", "context": {"doc": "d"}},
        {"id": "c2", "agent": "summarizer", "instruction": "summarise", "context": None}])
    ledger.handle(faust_event(TP(MINE, 0), 5, b"lead-1", encode(event)))
    await _spin()
    assert tasks["lead-1"]["state"] == leases.AWAITING_SUBTASKS and tasks["lead-1"]["lease_until"] == 0
    subs = {t: TaskPayload.model_validate_json(v or b"") for t, v in sent if t.startswith("agent.tasks.")}
    assert set(subs) == {"agent.tasks.analyzer", "agent.tasks.summarizer"}
    first = subs["agent.tasks.analyzer"]
    assert first.task_id == "lead-1/c1" and first.context_data == {"doc": "d"} and first.deadline == LEAD.deadline
    assert first.parent == ParentRef(task_id="lead-1", app_id=SETTINGS.app_id, call_id="c1", lineage=["lead"])
    assert timers, "a timer finds the waiting task after a rebalance (its offsets are released)"


async def test_a_finished_subtask_tells_its_caller_on_the_callers_outcomes_topic() -> None:
    ledger, _, _, sent, _ = _ledger(SUB)
    run = Run(SUB, 1, "w2")
    failed = outcome.rejected(run, Rejected("permanent_error: 400", "the model refused", "primary:p"))
    ledger.handle(faust_event(TP(MINE, 0), 5, SUB.task_id.encode(), encode(failed)))
    await _spin()
    back = [decode(v or b"", OUTCOMES) for t, v in sent if t == topics.outcomes_topic("caller-app")]
    assert len(back) == 1 and isinstance(back[0], SubtaskResult)
    assert (back[0].task_id, back[0].agent, back[0].call_id) == ("lead-1/c1", "analyzer", "c1")
    assert back[0].result["status"] == "failed" and back[0].result["error"] == "the model refused"


async def test_a_subtask_dead_lettered_without_a_result_still_tells_its_caller() -> None:
    ledger, tasks, _, sent, _ = _ledger(SUB, dispatch=SETTINGS.max_attempts, lease_until=1.0)
    ledger.handle(faust_event(TP(MINE, 0), 5, SUB.task_id.encode(),
                              encode(LeaseExpired(dispatch=SETTINGS.max_attempts, worker="w1"))))
    await _spin()
    assert tasks[SUB.task_id]["state"] == leases.DEAD_LETTERED
    back = [decode(v or b"", OUTCOMES) for t, v in sent if t == topics.outcomes_topic("caller-app")]
    assert len(back) == 1 and back[0].result["status"] == "failed"  # type: ignore[union-attr]
    assert "max_attempts_exceeded" in back[0].result["error"]  # type: ignore[union-attr]


async def test_the_last_subtask_result_journals_it_and_dispatches_the_caller_once() -> None:
    waiting = json.dumps({"turn": 0, "calls": {"c1": "analyzer", "c2": "summarizer"}})
    ledger, tasks, _, _, dispatched = _ledger(LEAD, state=leases.AWAITING_SUBTASKS, lease_until=0.0,
                                              waiting=waiting)
    for offset, (call_id, agent) in enumerate([("c1", "analyzer"), ("c1", "analyzer"), ("c2", "summarizer")]):
        result = SubtaskResult(task_id=f"lead-1/{call_id}", agent=agent, call_id=call_id,
                               result={"status": "succeeded", "output": call_id})
        ledger.handle(faust_event(TP(MINE, 0), 10 + offset, b"lead-1", encode(result)))
        await _spin()
    record = tasks["lead-1"]
    assert record["state"] == leases.RUNNING and record["dispatch"] == 2
    journal = json.loads(record["steps_done"])
    assert [(e["kind"], e["id"]) for e in journal] == [("subresult", "c1"), ("subresult", "c2")], "the duplicate is not"
    assert len(dispatched) == 1 and dispatched[0][1] == 2 and len(dispatched[0][2]) == 2
