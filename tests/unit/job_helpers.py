"""The job state machine's test helpers: a plan of tasks, a submit and a step's result as the orchestrator makes
them, and what their effects say (tests/unit/tables/test_jobs.py, test_job_plans.py)."""

from __future__ import annotations

import json
from typing import Any

from agents_stream.tables import jobs
from agents_stream.tables.jobs import (
    DISPATCHED,
    FAILED,
    SUCCEEDED,
    Control,
    DispatchStep,
    EmitJobResult,
    JobRecord,
)

AGENTS = ("researcher", "writer", "reviewer")
JOB = "job-1"
T0 = 1_700_000_000.0


def task(id: str, agent: str = "writer", deps: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    return {"id": id, "agent": agent, "instruction": f"do {id}", "depends_on": list(deps), **extra}


def plan(*tasks: dict[str, Any]) -> dict[str, Any]:
    return {"tasks": list(tasks)}


CHAIN = plan(
    task("a", "researcher", context_data={"lang": "en"}),
    task("b", "writer", ("a",)),
    task("c", "reviewer", ("b",)),
    task("d", "writer", ("a", "c")),
)
DIAMOND = plan(task("a"), task("b", deps=("a",)), task("c", deps=("a",)), task("d", deps=("b", "c")))


def submit(plan: Any = None, *, record: JobRecord | None = None, goal: str | None = None, planner: str | None = None,
           context_data: dict | None = None, deadline: float | None = None, now: float = T0):
    return jobs.submit(record, job_id=JOB, plan=plan, goal=goal, planner=planner, context_data=context_data,
                       deadline=deadline, agents=AGENTS, now=now)


def result(record: JobRecord | None, step: str, status: str = SUCCEEDED, output: Any = None, *,
           error: str | None = None, now: float = T0 + 1):
    stepped = jobs.StepResult(
        f"{JOB}/{step}", status, output=f"out-{step}" if output is None else output,
        confidence="failed" if status == FAILED else "high", source="primary", error=error,
    )
    return jobs.on_result(record, stepped, agents=AGENTS, now=now)


def dispatched(effects: list) -> list[str]:
    return [e.step_id for e in effects if isinstance(e, DispatchStep)]


def events(effects: list) -> list[str]:
    return [e.event for e in effects if isinstance(e, Control)]


def job_result(effects: list) -> dict[str, Any]:
    [emitted] = [e for e in effects if isinstance(e, EmitJobResult)]
    return json.loads(emitted.result)


def statuses(record: JobRecord) -> dict[str, str]:
    return {sid: record.steps[sid]["status"] for sid in record.order}


def run(record: JobRecord, outcomes: dict[str, str]) -> tuple[JobRecord, list]:
    """Answer every dispatched step (outcome from ``outcomes``, default succeeded) until nothing is in flight."""
    effects_seen: list = []
    while True:
        in_flight = [sid for sid in record.order if record.steps[sid]["status"] == DISPATCHED]
        if not in_flight:
            return record, effects_seen
        status = outcomes.get(in_flight[0], SUCCEEDED)
        record, effects = result(record, in_flight[0], status, error="boom" if status == FAILED else None)
        effects_seen += effects
