"""The job state machine: a plan of tasks for sub-agents with dependencies, run as a DAG, pure and clock-free.

    (new) ──plan given──────────────► RUNNING ──every step final──► SUCCEEDED | PARTIAL | FAILED
      │                                  ▲
      └──goal + planner──► PLANNING ─────┘ (the planner's answer is a valid plan)
                              └──planner failed, or its plan is invalid──► FAILED

A step is dispatched once every step it depends on succeeded or was partial; a
failed step skips everything downstream of it; a cancel or a passed deadline
cancels whatever has not finished. Each transition takes the stored record (or
None) and an event and returns the new record plus the effects the caller must
carry out; no I/O happens here, so every path is unit-tested without a broker.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from agents_stream.tables.job_effects import Control, DispatchPlanner, DispatchStep, Effect, EmitJobResult
from agents_stream.tables.json_record import JsonRecord
from agents_stream.tables.plans import MAX_STEPS, PLAN_SCHEMA, PLANNER_STEP, PlanError, Step, validate_plan

__all__ = [
    "StepResult",
    "CANCELLED",
    "DISPATCHED",
    "FAILED",
    "MAX_STEPS",
    "PARTIAL",
    "PENDING",
    "PLANNER_STEP",
    "PLANNING",
    "PLAN_SCHEMA",
    "RUNNING",
    "SKIPPED",
    "SUCCEEDED",
    "Control",
    "DispatchPlanner",
    "DispatchStep",
    "Effect",
    "EmitJobResult",
    "JobRecord",
    "PlanError",
    "Step",
    "cancel",
    "due",
    "expire",
    "on_result",
    "step_of",
    "submit",
    "task_id_of",
    "validate_plan",
]

RECORD_VERSION = 1
RESULT_SCHEMA_VERSION = 1

# Job states.
PLANNING = "planning"
RUNNING = "running"
SUCCEEDED = "succeeded"
PARTIAL = "partial"
FAILED = "failed"
TERMINAL = frozenset({SUCCEEDED, PARTIAL, FAILED})

# Step statuses (succeeded, partial and failed are spelled as the TaskResult statuses they record).
PENDING = "pending"
DISPATCHED = "dispatched"
SKIPPED = "skipped"  # a step it depends on failed (or was skipped)
CANCELLED = "cancelled"  # the job was cancelled, or its deadline passed, before the step finished
#: what lets a dependent run: a partial answer is still an answer
DONE = frozenset({SUCCEEDED, PARTIAL})
FINAL = frozenset({SUCCEEDED, PARTIAL, FAILED, SKIPPED, CANCELLED})

def task_id_of(job_id: str, step_id: str) -> str:
    """The task id of a step: the same on every dispatch, so the task ledger deduplicates it."""
    return f"{job_id}/{step_id}"


def step_of(job_id: str, task_id: str) -> str | None:
    """The step a task id belongs to (``PLANNER_STEP`` for the planner's task), or None if not of this job."""
    prefix = f"{job_id}/"
    if not task_id.startswith(prefix):
        return None
    rest = task_id[len(prefix) :]
    # A step id has no "/": "a/b/c" is step "c" of job "a/b", never step "b/c" of job "a".
    return rest if rest and "/" not in rest else None


# -- the record ------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRecord(JsonRecord):
    """What the jobs table stores per job_id (as versioned JSON, never pickled).

    ``steps`` maps a step id to a JSON object: agent, instruction, depends_on,
    context_data, status, task_id (None until dispatched), output, confidence,
    source, error. Transitions build new dicts; a stored record is never mutated.
    """

    job_id: str
    state: str
    created_at: float  # epoch seconds
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # step ids in plan order
    context_data: dict[str, Any] = field(default_factory=dict)  # given to every step
    deadline: float | None = None  # epoch seconds
    finished_at: float | None = None
    result: str | None = None  # the stored job result JSON, re-emitted byte for byte
    goal: str | None = None
    planner: str | None = None  # the agent that turns the goal into a plan
    reason: str | None = None  # why the job ended as it did (None when every step succeeded)
    #: contract.models.task_digest of the planner's task (a step's is its "digest"): only that task's result counts
    planner_digest: str | None = None
    #: W3C traceparent of the job's span (ops/tracing.py): its steps' tasks are traced under it; None: not traced
    trace: str | None = None
    v: int = RECORD_VERSION

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


# -- transitions -----------------------------------------------------------------------


def submit(
    record: JobRecord | None,
    *,
    job_id: str,
    plan: Any = None,
    goal: str | None = None,
    planner: str | None = None,
    context_data: dict[str, Any] | None = None,
    deadline: float | None = None,
    agents: Collection[str],
    now: float,
    trace: str | None = None,
) -> tuple[JobRecord, list[Effect]]:
    """A job was submitted, with its plan or with a goal for ``planner`` to plan (a duplicate, or a redelivery).

    An invalid plan fails the job at once, with its result emitted: whoever
    submitted it waits for a result, not for a deadline.
    """
    if record is not None:
        # A finished job never runs again; a redelivery re-emits its result, a duplicate changes nothing.
        return record, [EmitJobResult(record.result)] if record.terminal and record.result is not None else []
    if (plan is None) == (goal is None) or (goal is not None and not planner):
        raise ValueError("a job is submitted with a plan, or with a goal and a planner; not both, not neither")
    new = JobRecord(
        job_id=job_id,
        state=PLANNING if plan is None else RUNNING,
        created_at=now,
        context_data=dict(context_data or {}),
        deadline=deadline,
        goal=goal,
        planner=planner,
        trace=trace,
    )
    if goal is not None:  # no plan (checked above): the planner writes one
        if planner is None or planner not in agents:
            return _finish(new, {}, reason=f"unknown_planner: {planner!r} is not a known agent", now=now)
        return new, [
            Control("job.started", {"planner": planner}),
            DispatchPlanner(
                task_id=task_id_of(job_id, PLANNER_STEP),
                agent=planner,
                instruction=_planner_instruction(goal, agents),
                context_data={**new.context_data, "goal": goal, "agents": sorted(agents)},
            ),
        ]
    try:
        steps = validate_plan(plan, agents)
    except PlanError as exc:
        return _finish(new, {}, reason=f"invalid_plan: {exc}", now=now)
    return _start(new, steps, Control("job.started", {"steps": len(steps)}), now=now)


@dataclass(frozen=True)
class StepResult:
    """A job task's result as the job reads it: what it says (``status``: succeeded, partial or failed), and who
    it is from (``agent``, ``digest``: None when the sender did not say)."""

    task_id: str
    status: str
    output: Any = None
    confidence: str | None = None
    source: str | None = None
    error: str | None = None
    agent: str | None = None
    digest: str | None = None


def on_result(
    record: JobRecord | None, result: StepResult, *, agents: Collection[str], now: float,
) -> tuple[JobRecord | None, list[Effect]]:
    """A TaskResult of one of the job's tasks arrived.

    Only the first result of a dispatched task counts: a duplicate, a late
    result after a cancel, or a result of a task never dispatched changes nothing.
    A result of another agent or task (``agent``, ``digest``, when given) than the
    step's is refused with an alert: a producer's own ``<job>/<step>`` task cannot answer.
    """
    task_id, status, output, error = result.task_id, result.status, result.output, result.error
    if status not in (SUCCEEDED, PARTIAL, FAILED):
        raise ValueError(f"unknown task status {status!r}")
    if record is None or record.terminal:
        return record, []
    step_id = step_of(record.job_id, task_id)
    refused = _foreign(record, step_id, task_id, result.agent, result.digest)
    if refused is not None:
        return record, [refused]
    if step_id == PLANNER_STEP:
        if record.state != PLANNING:
            return record, []
        if status == FAILED:
            return _finish(record, {}, reason=f"planner_failed: {error or 'no reason given'}", now=now)
        try:
            plan_steps = validate_plan(output, agents)
        except PlanError as exc:
            return _finish(record, {}, reason=f"invalid_plan: {exc}", now=now)
        planned = replace(record, state=RUNNING)
        return _start(planned, plan_steps, Control("job.planned", {"steps": len(plan_steps)}), now=now)
    if step_id is None or step_id not in record.steps or record.steps[step_id]["status"] != DISPATCHED:
        return record, []
    steps = {k: dict(v) for k, v in record.steps.items()}
    steps[step_id].update(status=status, output=output, confidence=result.confidence, source=result.source, error=error)
    skipped = []
    if status == FAILED:
        for sid in _downstream(record, step_id):
            steps[sid]["status"] = SKIPPED
            skipped.append(sid)
    details: dict[str, Any] = {"step": step_id, "task_id": task_id, "agent": steps[step_id]["agent"], "status": status}
    if skipped:
        details["skipped"] = skipped
    return _advance(record, steps, [Control("job.step_finished", details)], now=now)


def _foreign(
    record: JobRecord, step_id: str | None, task_id: str, agent: str | None, digest: str | None,
) -> Control | None:
    """The alert refusing a result that is not of the task the job dispatched for ``step_id``, or None."""
    if step_id == PLANNER_STEP:
        expected_agent, expected_digest = record.planner, record.planner_digest
    elif step_id is not None and step_id in record.steps:
        expected_agent, expected_digest = record.steps[step_id]["agent"], record.steps[step_id].get("digest")
    else:
        return None  # not one of the job's steps: on_result ignores it anyway
    if agent is not None and agent != expected_agent:
        why = f"from agent {agent!r}, the step's agent is {expected_agent!r}"
    elif digest is not None and expected_digest is not None and digest != expected_digest:
        why = "of another task than the one the job dispatched (its payload differs)"
    else:
        return None
    return Control("alert.job_result_refused", {"step": step_id, "task_id": task_id, "reason": why})


def stamp(record: JobRecord | None, digests: dict[str, str]) -> JobRecord | None:
    """``record`` with the digest of each task just dispatched (``digests`` by task_id), so that only that
    task's result counts for its step (``on_result``)."""
    if record is None or not digests:
        return record
    steps = {
        sid: {**step, "digest": digests[step["task_id"]]} if step.get("task_id") in digests else step
        for sid, step in record.steps.items()
    }
    planner = digests.get(task_id_of(record.job_id, PLANNER_STEP), record.planner_digest)
    return replace(record, steps=steps, planner_digest=planner)


def cancel(record: JobRecord | None, *, by: str, reason: str, now: float) -> tuple[JobRecord | None, list[Effect]]:
    """An operator cancels the job: what has not finished is cancelled, and the job ends with what is done.

    A job still planning has no step done, so it fails.
    """
    if record is None or record.terminal:
        return record, []
    return _stop(record, by=by, reason=f"cancelled by {by}: {reason}", now=now)


def expire(record: JobRecord | None, *, now: float) -> tuple[JobRecord | None, list[Effect]]:
    """The scanner saw the deadline pass: like a cancel, with reason ``deadline_exceeded``; otherwise a no-op."""
    if record is None or not due(record, now):
        return record, []
    return _stop(record, by="deadline", reason="deadline_exceeded", now=now)


def due(record: JobRecord | None, now: float) -> bool:
    """Whether the job is still planning or running past its deadline."""
    return record is not None and not record.terminal and record.deadline is not None and now >= record.deadline


# -- internals -------------------------------------------------------------------------


def _planner_instruction(goal: str, agents: Collection[str]) -> str:
    names = ", ".join(sorted(agents))
    return (
        f"{goal}\n\n"
        f"Do not do this work yourself: break it into tasks for these agents: {names}. "
        'Answer with only a JSON object {"tasks": [...]}. Each task has an "id" (1 to 64 letters, digits, '
        f"'_', '.' or '-', unique, not {PLANNER_STEP!r}), the \"agent\" that does it, its \"instruction\", and "
        '"depends_on": the ids of the tasks whose outputs it needs (no cycles). '
        f"At most {MAX_STEPS} tasks; tasks that depend on nothing run at once, in parallel."
    )


def _start(
    record: JobRecord, plan: tuple[Step, ...], started: Control, *, now: float
) -> tuple[JobRecord, list[Effect]]:
    steps = {
        s.id: {
            "agent": s.agent,
            "instruction": s.instruction,
            "depends_on": list(s.depends_on),
            "context_data": dict(s.context_data),
            "status": PENDING,
            "task_id": None,
            "output": None,
            "confidence": None,
            "source": None,
            "error": None,
        }
        for s in plan
    }
    return _advance(replace(record, state=RUNNING, order=[s.id for s in plan]), steps, [started], now=now)


def _downstream(record: JobRecord, step_id: str) -> list[str]:
    """Every step that depends on ``step_id``, directly or not, in plan order."""
    found = {step_id}
    # plan order need not be topological: repeat until nothing more is found
    grew = True
    while grew:
        grew = False
        for sid in record.order:
            if sid not in found and any(d in found for d in record.steps[sid]["depends_on"]):
                found.add(sid)
                grew = True
    return [sid for sid in record.order if sid in found and sid != step_id]


def _advance(
    record: JobRecord, steps: dict[str, dict[str, Any]], effects: list[Effect], *, now: float
) -> tuple[JobRecord, list[Effect]]:
    """Dispatch every pending step whose dependencies are done; finish when every step is final."""
    for sid in record.order:
        step = steps[sid]
        if step["status"] != PENDING or any(steps[d]["status"] not in DONE for d in step["depends_on"]):
            continue
        task_id = task_id_of(record.job_id, sid)
        step.update(status=DISPATCHED, task_id=task_id)
        context = {**record.context_data, **step["context_data"]}
        if step["depends_on"]:
            context["upstream"] = {d: steps[d]["output"] for d in step["depends_on"]}
        effects.append(DispatchStep(sid, task_id, step["agent"], step["instruction"], context))
    if all(s["status"] in FINAL for s in steps.values()):
        done, finishing = _finish(record, steps, reason=None, now=now)
        return done, [*effects, *finishing]
    return replace(record, steps=steps), effects


def _stop(record: JobRecord, *, by: str, reason: str, now: float) -> tuple[JobRecord, list[Effect]]:
    steps = {k: dict(v) for k, v in record.steps.items()}
    # the tasks in flight, for the caller to cancel or let run out (their late results are ignored)
    in_flight = [task_id_of(record.job_id, PLANNER_STEP)] if record.state == PLANNING else []
    agents = {in_flight[0]: record.planner} if in_flight and record.planner else {}
    for sid in record.order:
        if steps[sid]["status"] == DISPATCHED:
            in_flight.append(steps[sid]["task_id"])
            agents[steps[sid]["task_id"]] = steps[sid]["agent"]
        if steps[sid]["status"] in (PENDING, DISPATCHED):
            steps[sid]["status"] = CANCELLED
    stopped = Control("job.cancelled", {"by": by, "reason": reason, "tasks": in_flight, "agents": agents})
    done, effects = _finish(record, steps, reason=reason, now=now)
    return done, [stopped, *effects]


def _finish(
    record: JobRecord, steps: dict[str, dict[str, Any]], *, reason: str | None, now: float
) -> tuple[JobRecord, list[Effect]]:
    statuses = [s["status"] for s in steps.values()]
    if statuses and all(s == SUCCEEDED for s in statuses):
        state = SUCCEEDED
    elif any(s in DONE for s in statuses):
        state = PARTIAL
    else:
        state = FAILED
    if reason is None and state != SUCCEEDED:
        reason = "; ".join(
            f"{status}: {', '.join(sid for sid in record.order if steps[sid]['status'] == status)}"
            for status in (FAILED, SKIPPED, PARTIAL)
            if status in statuses
        )
    depended_on = {d for s in steps.values() for d in s["depends_on"]}
    result = json.dumps(
        {
            "schema_version": RESULT_SCHEMA_VERSION,
            "job_id": record.job_id,
            "status": state,
            "steps": {
                sid: {k: steps[sid][k] for k in ("task_id", "agent", "status", "confidence", "source", "error")}
                for sid in record.order
            },
            # only the sinks' outputs: every other output is in the TaskResult its task_id names
            "output": {
                sid: steps[sid]["output"]
                for sid in record.order
                if sid not in depended_on and steps[sid]["status"] in DONE
            },
            "reason": reason,
            "completed_at": _iso(now),
        },
        separators=(",", ":"),
    )
    done = replace(record, state=state, steps=steps, finished_at=now, result=result, reason=reason)
    return done, [EmitJobResult(result), Control("job.completed", {"status": state, "reason": reason})]


def _iso(now: float) -> str:
    return datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
