"""A job's plan (tables/jobs.py, tables/plans.py): the planner agent that writes one from a goal, and the validation
every plan passes before a step runs, without I/O."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from agents_stream.tables import jobs
from agents_stream.tables.jobs import (
    FAILED,
    MAX_STEPS,
    PARTIAL,
    PLAN_SCHEMA,
    PLANNING,
    RUNNING,
    SUCCEEDED,
    Control,
    DispatchPlanner,
    EmitJobResult,
    PlanError,
    Step,
)

from tests.unit.job_helpers import (
    AGENTS,
    CHAIN,
    DIAMOND,
    dispatched,
    job_result,
    plan,
    result,
    run,
    submit,
    task,
)

# -- the planner ---------------------------------------------------------------------------------------


def test_goal_submit_dispatches_the_planner_with_the_goal_and_the_agents() -> None:
    """A goal starts the job in PLANNING with one planning task that lists the agents and asks for a JSON plan."""
    record, effects = submit(goal="Write a market report on tea.", planner="researcher", context_data={"k": 1})
    assert record.state == PLANNING and record.goal == "Write a market report on tea."
    assert record.planner == "researcher" and record.steps == {} and not record.terminal
    started, planner = effects
    assert started == Control("job.started", {"planner": "researcher"})
    assert isinstance(planner, DispatchPlanner)
    assert planner.task_id == "job-1/plan" and planner.agent == "researcher"
    assert planner.instruction.startswith("Write a market report on tea.\n\n")
    assert "researcher, reviewer, writer" in planner.instruction and "JSON" in planner.instruction
    assert planner.context_data == {"k": 1, "goal": "Write a market report on tea.",
                                    "agents": ["researcher", "reviewer", "writer"]}


def test_goal_with_an_unknown_planner_fails_at_once() -> None:
    """A planner that is not a known agent would never answer: the job fails instead of waiting."""
    record, effects = submit(goal="g", planner="oracle")
    assert record.state == FAILED and record.reason.startswith("unknown_planner:")
    assert [type(e) for e in effects] == [EmitJobResult, Control]


@pytest.mark.parametrize("status", [SUCCEEDED, PARTIAL])
@pytest.mark.parametrize("as_text", [False, True])
def test_planner_answer_starts_the_plan(status: str, as_text: bool) -> None:
    """The planner's plan (as JSON or as text) moves the job to RUNNING and dispatches its roots."""
    record, _ = submit(goal="g", planner="researcher")
    output = json.dumps(DIAMOND) if as_text else DIAMOND
    record, effects = result(record, "plan", status, output=output)
    assert record.state == RUNNING and record.order == ["a", "b", "c", "d"]
    assert effects[0] == Control("job.planned", {"steps": 4})
    assert dispatched(effects) == ["a"]
    record, _ = run(record, {})
    assert record.state == SUCCEEDED and record.goal == "g"


def test_planner_answer_in_a_code_fence_is_accepted() -> None:
    """Models like to fence JSON in Markdown; the fence is not part of the plan."""
    record, _ = submit(goal="g", planner="researcher")
    record, _ = result(record, "plan", output="```json\n" + json.dumps(CHAIN) + "\n```")
    assert record.state == RUNNING


def test_planner_invalid_plan_fails_the_job() -> None:
    """A planner answer that is not a valid plan fails the job with reason invalid_plan."""
    record, _ = submit(goal="g", planner="researcher")
    record, effects = result(record, "plan", output=plan(task("a", "astrologer")))
    assert record.state == FAILED
    assert record.reason.startswith("invalid_plan: task 'a' names agent 'astrologer'")
    assert job_result(effects)["reason"] == record.reason


def test_planner_failure_fails_the_job() -> None:
    """A failed planning task fails the job with reason planner_failed and the planner's error."""
    record, _ = submit(goal="g", planner="researcher")
    record, effects = result(record, "plan", FAILED, error="all providers down")
    assert record.state == FAILED and record.reason == "planner_failed: all providers down"
    assert effects[-1] == Control("job.completed", {"status": FAILED, "reason": "planner_failed: all providers down"})


def test_planner_result_after_planning_and_step_results_during_planning_are_ignored() -> None:
    """A duplicate planner result cannot replan a running job; a step result cannot arrive before the plan."""
    record, _ = submit(goal="g", planner="researcher")
    assert result(record, "a") == (record, [])
    record, _ = result(record, "plan", output=CHAIN)
    assert result(record, "plan", output=DIAMOND) == (record, [])


# -- validation ----------------------------------------------------------------------------------------


def test_valid_plan_gives_steps_in_plan_order_with_defaults() -> None:
    """validate_plan returns typed steps; depends_on and context_data default to empty, extra fields are ignored."""
    steps = jobs.validate_plan(
        {"tasks": [{"id": "b", "agent": "writer", "instruction": "x", "depends_on": ["a", "a"], "why": "!"},
                   {"id": "a", "agent": "reviewer", "instruction": "", "context_data": {"n": 1}}],
         "notes": "ignored"},
        AGENTS,
    )
    assert steps == (Step("b", "writer", "x", ("a",)), Step("a", "reviewer", "", (), {"n": 1}))


def test_cycle_is_rejected_and_its_members_named() -> None:
    """A cycle can never start; the message names the tasks in it, in run order."""
    p = plan(task("start"), task("a", deps=("c", "start")), task("b", deps=("a",)), task("c", deps=("b",)),
             task("off", deps=("start",)))
    with pytest.raises(PlanError, match="cycle") as info:
        jobs.validate_plan(p, AGENTS)
    cycle = str(info.value).split(": ", 1)[1]
    assert cycle in ("a -> b -> c -> a", "b -> c -> a -> b", "c -> a -> b -> c")


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (plan(task("a", deps=("nope",))), "task 'a' depends on 'nope', not a task of the plan"),
        (plan(task("a", deps=("a",))), "task 'a' depends on itself"),
        (plan(task("a", "ghost")),
         "names agent 'ghost', which is not known; known agents: researcher, reviewer, writer"),
        (plan(task("a"), task("b"), task("a"), task("b")), "task ids must be unique; repeated: a, b"),
        (plan(task("plan")), "'plan' is reserved"),
        ("{not json", "the plan is not JSON"),
        ('{"tasks": [NaN]}', "the plan is not JSON"),
        (b"\xff", "the plan is not JSON"),
        ({}, r"at \$: missing required property 'tasks'"),
        ([], r"at \$: expected object, got array"),
        (plan(), r"at \$\.tasks: 0 items, at least 1 required"),
        (plan(*(task(f"t{i}") for i in range(MAX_STEPS + 1))), r"at \$\.tasks: 101 items, at most 100 allowed"),
        (plan(task("has space")), r"\$\.tasks\[0\]\.id"),
        (plan(task("x" * 65)), r"\$\.tasks\[0\]\.id"),
        (plan(task("a\n")), "1 to 64 letters"),
        (plan(task("a", "")), r"\$\.tasks\[0\]\.agent"),
        (plan({"id": "a", "agent": "writer"}), r"\$\.tasks\[0\]: missing required property 'instruction'"),
        (plan(task("a", depends_on="b")), r"\$\.tasks\[0\]\.depends_on: expected array, got string"),
        (plan(task("a", context_data=[1])), r"\.context_data: expected object, got array"),
    ],
)
def test_invalid_plans_are_rejected_with_a_clear_message(bad: Any, message: str) -> None:
    """Every way a plan cannot run is a PlanError naming the problem."""
    with pytest.raises(PlanError, match=message):
        jobs.validate_plan(bad, AGENTS)


def test_plan_error_is_a_value_error() -> None:
    """Callers that handle ValueError handle a bad plan too."""
    assert issubclass(PlanError, ValueError)


def test_plan_schema_is_a_plain_valid_draft_2020_12_schema() -> None:
    """The schema handed to the planner model as output_schema is itself valid and allows a full plan."""
    jsonschema.Draft202012Validator.check_schema(PLAN_SCHEMA)
    jsonschema.Draft202012Validator(PLAN_SCHEMA).validate(CHAIN)
    assert "$ref" not in json.dumps(PLAN_SCHEMA)
