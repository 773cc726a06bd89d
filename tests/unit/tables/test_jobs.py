"""The job state machine (tables/jobs.py): DAG dispatch, failure and partial results, duplicates, cancel and deadline,
the record, without I/O (the plan and the planner: test_job_plans.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from agents_stream.tables import jobs
from agents_stream.tables.jobs import (
    CANCELLED,
    DISPATCHED,
    FAILED,
    PARTIAL,
    PENDING,
    RUNNING,
    SKIPPED,
    SUCCEEDED,
    Control,
    DispatchStep,
    EmitJobResult,
    JobRecord,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.job_helpers import (
    AGENTS,
    CHAIN,
    DIAMOND,
    JOB,
    T0,
    dispatched,
    events,
    job_result,
    plan,
    result,
    statuses,
    submit,
    task,
)

# -- the 4-task chain over 3 agents ------------------------------------------------------


def test_chain_runs_each_step_after_its_dependencies_and_hands_down_their_outputs() -> None:
    """a → b → c, and d after a and c: each step is dispatched once its deps are done,
    with their outputs as upstream."""
    record, effects = submit(CHAIN, context_data={"customer": "acme"})
    assert record.state == RUNNING and record.order == ["a", "b", "c", "d"]
    assert effects == [
        Control("job.started", {"steps": 4}),
        DispatchStep("a", "job-1/a", "researcher", "do a", {"customer": "acme", "lang": "en"}),
    ]
    assert statuses(record) == {"a": DISPATCHED, "b": PENDING, "c": PENDING, "d": PENDING}

    record, effects = result(record, "a", output={"facts": [1, 2]})
    assert effects == [
        Control("job.step_finished", {"step": "a", "task_id": "job-1/a", "agent": "researcher", "status": SUCCEEDED}),
        DispatchStep("b", "job-1/b", "writer", "do b", {"customer": "acme", "upstream": {"a": {"facts": [1, 2]}}}),
    ]
    record, effects = result(record, "b", output="draft")
    assert dispatched(effects) == ["c"]
    record, effects = result(record, "c", output="approved")
    [d] = [e for e in effects if isinstance(e, DispatchStep)]
    assert d == DispatchStep(
        "d", "job-1/d", "writer", "do d", {"customer": "acme", "upstream": {"a": {"facts": [1, 2]}, "c": "approved"}}
    )
    assert not record.terminal

    record, effects = result(record, "d", output="final text", now=T0 + 9.5)
    assert record.state == SUCCEEDED and record.terminal and record.reason is None and record.finished_at == T0 + 9.5
    assert events(effects) == ["job.step_finished", "job.completed"]
    assert effects[-1] == Control("job.completed", {"status": SUCCEEDED, "reason": None})
    step = '"agent":"{}","status":"succeeded","confidence":"high","source":"primary","error":null}}'
    assert effects[1] == EmitJobResult(
        '{"schema_version":1,"job_id":"job-1","status":"succeeded","steps":{'
        + ",".join(f'"{s}":{{"task_id":"job-1/{s}",' + step.format(a) for s, a in
                   [("a", "researcher"), ("b", "writer"), ("c", "reviewer"), ("d", "writer")])
        + '},"output":{"d":"final text"},"reason":null,"completed_at":"2023-11-14T22:13:29.500Z"}'
    )
    assert record.result == effects[1].result


def test_root_steps_are_dispatched_together_in_plan_order() -> None:
    """Every step without dependencies starts at submit, in the order the plan lists them."""
    _, effects = submit(plan(task("x"), task("y", deps=("x",)), task("z", "reviewer")))
    assert dispatched(effects) == ["x", "z"]


def test_plan_order_need_not_be_topological() -> None:
    """A step may be listed before the step it depends on; it still waits for it."""
    record, effects = submit(plan(task("late", deps=("early",)), task("early")))
    assert dispatched(effects) == ["early"]
    record, effects = result(record, "early")
    assert dispatched(effects) == ["late"]


# -- diamond -------------------------------------------------------------------------------


def test_diamond_fans_out_then_joins_once_both_branches_are_done() -> None:
    """a → (b, c) → d: b and c run in parallel after a; d waits for both and sees both outputs."""
    record, _ = submit(DIAMOND)
    record, effects = result(record, "a")
    assert dispatched(effects) == ["b", "c"]
    record, effects = result(record, "c")
    assert dispatched(effects) == []
    record, effects = result(record, "b")
    [d] = [e for e in effects if isinstance(e, DispatchStep)]
    assert d.context_data == {"upstream": {"b": "out-b", "c": "out-c"}}
    record, effects = result(record, "d")
    assert record.state == SUCCEEDED
    assert job_result(effects)["output"] == {"d": "out-d"}


# -- failure and partial -------------------------------------------------------------------------


def test_a_failed_step_skips_everything_downstream_and_the_job_is_partial() -> None:
    """a fails: b and c (downstream) are skipped at once, the independent e still runs, and the job is partial."""
    record, _ = submit(plan(task("a"), task("b", deps=("a",)), task("c", deps=("b",)), task("e", "reviewer")))
    record, effects = result(record, "a", FAILED, error="provider down")
    assert statuses(record) == {"a": FAILED, "b": SKIPPED, "c": SKIPPED, "e": DISPATCHED}
    assert effects == [Control("job.step_finished", {"step": "a", "task_id": "job-1/a", "agent": "writer",
                                                     "status": FAILED, "skipped": ["b", "c"]})]
    assert record.steps["a"]["error"] == "provider down"
    record, effects = result(record, "e")
    assert record.state == PARTIAL
    body = job_result(effects)
    assert body["status"] == PARTIAL
    assert body["output"] == {"e": "out-e"}  # the sink c was skipped: no output
    assert body["steps"]["b"] == {"task_id": None, "agent": "writer", "status": SKIPPED, "confidence": None,
                                  "source": None, "error": None}
    assert body["steps"]["a"]["error"] == "provider down"
    assert body["reason"] == record.reason == "failed: a; skipped: b, c"


def test_a_partial_step_lets_its_dependents_run_but_the_job_is_partial() -> None:
    """A partial answer counts as done for dependents; the job is partial, and the partial sink's output is kept."""
    record, _ = submit(plan(task("a"), task("b", deps=("a",))))
    record, effects = result(record, "a", PARTIAL, output="half")
    assert dispatched(effects) == ["b"]
    record, effects = result(record, "b", PARTIAL)
    assert record.state == PARTIAL and record.reason == "partial: a, b"
    assert job_result(effects)["output"] == {"b": "out-b"}


def test_every_step_failed_fails_the_job() -> None:
    """No step succeeded or was partial: the job failed, with no output."""
    record, _ = submit(plan(task("a"), task("b", "reviewer")))
    record, _ = result(record, "a", FAILED)
    record, effects = result(record, "b", FAILED)
    assert record.state == FAILED
    assert job_result(effects)["output"] == {}
    assert effects[-1] == Control("job.completed", {"status": FAILED, "reason": "failed: a, b"})


def test_a_failed_root_with_only_dependents_fails_the_job_at_once() -> None:
    """When the only root fails, everything is skipped and the job ends on that same result."""
    record, _ = submit(CHAIN)
    record, effects = result(record, "a", FAILED)
    assert record.state == FAILED
    assert statuses(record) == {"a": FAILED, "b": SKIPPED, "c": SKIPPED, "d": SKIPPED}
    assert events(effects) == ["job.step_finished", "job.completed"]


def test_unknown_task_status_is_a_caller_bug() -> None:
    """Only the three TaskResult statuses are understood."""
    record, _ = submit(CHAIN)
    with pytest.raises(ValueError, match="unknown task status"):
        result(record, "a", "done")


# -- duplicates and redelivery -----------------------------------------------------------------


def test_duplicate_result_is_ignored() -> None:
    """A second result for a step already final changes nothing and dispatches nothing."""
    record, _ = submit(CHAIN)
    record, _ = result(record, "a")
    again, effects = result(record, "a", FAILED)
    assert again is record and effects == []


@pytest.mark.parametrize("task_id", ["job-1/zz", "job-2/a", "job-1/b", "job-1/", "job-1/x/a", "a"])
def test_result_of_a_task_not_in_flight_here_is_ignored(task_id: str) -> None:
    """Results for other jobs, unknown steps, or steps never dispatched are not this job's business."""
    record, _ = submit(CHAIN)
    got, effects = jobs.on_result(record, jobs.StepResult(task_id, SUCCEEDED), agents=AGENTS, now=T0)
    assert got is record and effects == []


def test_result_for_a_finished_or_missing_job_is_ignored() -> None:
    """A late result after the job ended (or for no job) changes nothing."""
    record, _ = submit(plan(task("a"), task("b", "reviewer")))
    record, _ = jobs.cancel(record, by="ops", reason="stop", now=T0)
    assert result(record, "a") == (record, [])
    assert result(None, "a") == (None, [])


def test_redelivered_submit_of_a_finished_job_reemits_the_same_bytes() -> None:
    """A finished job never runs again; a redelivered submit re-emits its stored result byte for byte."""
    record, _ = submit(plan(task("a")))
    record, effects = result(record, "a")
    stored = job_result(effects)
    again, effects = submit(plan(task("a")), record=record, now=T0 + 100)
    assert again is record
    assert effects == [EmitJobResult(record.result)]
    assert json.loads(effects[0].result) == stored


def test_duplicate_submit_of_a_running_job_changes_nothing() -> None:
    """A second submit while the job runs neither restarts it nor dispatches anything."""
    record, _ = submit(CHAIN)
    assert submit(CHAIN, record=record) == (record, [])
    assert submit(goal="g", planner="writer", record=record) == (record, [])


@pytest.mark.parametrize("kwargs", [{}, {"plan": CHAIN, "goal": "g", "planner": "writer"}, {"goal": "g"}])
def test_submit_needs_a_plan_or_a_goal_with_a_planner(kwargs: dict) -> None:
    """The caller gives exactly one of a plan and a goal (with its planner)."""
    with pytest.raises(ValueError, match="plan"):
        submit(**kwargs)


def test_submit_with_an_invalid_plan_fails_the_job_at_once() -> None:
    """An invalid plan ends the job as failed, its result emitted, without dispatching anything."""
    record, effects = submit(plan(task("a", deps=("ghost",))))
    assert record.state == FAILED and record.terminal and record.finished_at == T0
    assert record.reason.startswith("invalid_plan: task 'a' depends on 'ghost'")
    assert [type(e) for e in effects] == [EmitJobResult, Control]
    body = job_result(effects)
    assert body["status"] == FAILED and body["steps"] == {} and body["output"] == {}
    assert body["reason"] == record.reason


# -- cancel and deadline ---------------------------------------------------------------------------


def test_cancel_mid_run_cancels_what_is_unfinished_and_keeps_what_is_done() -> None:
    """Cancel after a succeeded: b (in flight) and c, d (pending) are cancelled; the job is partial."""
    record, _ = submit(CHAIN)
    record, _ = result(record, "a")
    record, effects = jobs.cancel(record, by="alice", reason="not needed", now=T0 + 5)
    assert statuses(record) == {"a": SUCCEEDED, "b": CANCELLED, "c": CANCELLED, "d": CANCELLED}
    assert record.state == PARTIAL and record.reason == "cancelled by alice: not needed"
    assert effects[0] == Control("job.cancelled", {"by": "alice", "reason": "cancelled by alice: not needed",
                                                   "tasks": ["job-1/b"], "agents": {"job-1/b": "writer"}})
    assert effects[-1] == Control("job.completed", {"status": PARTIAL, "reason": "cancelled by alice: not needed"})
    assert job_result(effects)["output"] == {}  # the sink d never ran
    assert result(record, "b") == (record, [])  # the late result of the cancelled task


def test_cancel_before_anything_finished_fails_the_job() -> None:
    """With no step done, a cancelled job has failed."""
    record, _ = submit(DIAMOND)
    record, effects = jobs.cancel(record, by="bob", reason="wrong input", now=T0 + 1)
    assert record.state == FAILED
    assert set(statuses(record).values()) == {CANCELLED}


def test_cancel_of_a_planning_job_fails_it_and_names_the_planner_task() -> None:
    """A job still planning has nothing done: cancelling fails it, and the planner's task is the one in flight."""
    record, _ = submit(goal="write a report", planner="researcher")
    record, effects = jobs.cancel(record, by="ops", reason="budget", now=T0 + 1)
    assert record.state == FAILED and record.reason == "cancelled by ops: budget"
    assert effects[0].details["tasks"] == ["job-1/plan"]
    assert effects[0].details["agents"] == {"job-1/plan": "researcher"}, "its cancel can name the planner's agent"
    assert result(record, "plan", output=CHAIN) == (record, [])


def test_cancel_of_a_finished_or_missing_job_is_a_no_op() -> None:
    """Cancelling is too late once the job ended."""
    record, _ = submit(plan(task("a")))
    record, _ = result(record, "a")
    assert jobs.cancel(record, by="x", reason="y", now=T0) == (record, [])
    assert jobs.cancel(None, by="x", reason="y", now=T0) == (None, [])


def test_deadline_expires_a_running_job_once_due() -> None:
    """Before the deadline nothing happens; at it, unfinished steps are cancelled with reason deadline_exceeded."""
    record, _ = submit(DIAMOND, deadline=T0 + 60)
    record, _ = result(record, "a")
    assert not jobs.due(record, T0 + 59.9)
    assert jobs.expire(record, now=T0 + 59.9) == (record, [])
    assert jobs.due(record, T0 + 60)
    record, effects = jobs.expire(record, now=T0 + 61)
    assert record.state == PARTIAL and record.reason == "deadline_exceeded"
    assert statuses(record) == {"a": SUCCEEDED, "b": CANCELLED, "c": CANCELLED, "d": CANCELLED}
    assert effects[0] == Control("job.cancelled", {"by": "deadline", "reason": "deadline_exceeded",
                                                   "tasks": ["job-1/b", "job-1/c"],
                                                   "agents": {"job-1/b": "writer", "job-1/c": "writer"}})
    assert job_result(effects)["reason"] == "deadline_exceeded"
    assert not jobs.due(record, T0 + 1000)
    assert jobs.expire(record, now=T0 + 1000) == (record, [])


def test_deadline_expires_a_planning_job_as_failed() -> None:
    """A planner that does not answer in time fails the job."""
    record, _ = submit(goal="g", planner="writer", deadline=T0 + 10)
    assert jobs.due(record, T0 + 10)
    record, _ = jobs.expire(record, now=T0 + 10)
    assert record.state == FAILED and record.reason == "deadline_exceeded"


def test_a_job_without_deadline_is_never_due() -> None:
    """No deadline: the scanner leaves the job alone however late it is."""
    record, _ = submit(CHAIN)
    assert not jobs.due(record, T0 + 10**9)
    assert jobs.expire(record, now=T0 + 10**9) == (record, [])
    assert not jobs.due(None, T0)
    assert jobs.expire(None, now=T0) == (None, [])


@pytest.mark.parametrize("step", ["a", "plan", "x.y-z_1"])
def test_task_ids_map_back_to_steps(step: str) -> None:
    """task_id_of and step_of are inverses for this job; other jobs' task ids map to None."""
    assert jobs.task_id_of("j/1", step) == f"j/1/{step}"
    assert jobs.step_of("j/1", jobs.task_id_of("j/1", step)) == step
    assert jobs.step_of("j", jobs.task_id_of("j/1", step)) is None
    assert jobs.step_of("j/2", jobs.task_id_of("j/1", step)) is None


# -- the record ----------------------------------------------------------------------------------------


def test_record_round_trips_through_json_and_ignores_unknown_keys() -> None:
    """The table stores versioned JSON: a record read back equals the one written; newer fields are ignored."""
    record, _ = submit(CHAIN, context_data={"customer": "acme"}, deadline=T0 + 60)
    record, _ = result(record, "a", output={"nested": [1, {"x": None}]})
    data = json.loads(json.dumps(record.to_json()))
    assert data["v"] == 1
    assert JobRecord.from_json(data) == record
    assert JobRecord.from_json({**data, "added_in_v2": True}) == record
    done, _ = jobs.cancel(record, by="x", reason="y", now=T0 + 2)
    assert JobRecord.from_json(json.loads(json.dumps(done.to_json()))) == done


def test_transitions_never_mutate_the_record_they_are_given() -> None:
    """Faust tables need assignment, not in-place change: the input record is left as it was."""
    record, _ = submit(DIAMOND)
    before = copy.deepcopy(record)
    after_a, _ = result(record, "a")
    assert record == before
    snapshot = copy.deepcopy(after_a)
    result(after_a, "b", FAILED)
    jobs.cancel(after_a, by="x", reason="y", now=T0)
    assert after_a == snapshot


def test_completed_at_is_iso_utc_with_milliseconds() -> None:
    """The job result carries its completion time from ``now``, as ISO-8601 UTC with ms and Z."""
    record, _ = jobs.submit(None, job_id="j", plan=plan(task("a")), agents=AGENTS, now=0.0)
    _, effects = jobs.on_result(record, jobs.StepResult("j/a", SUCCEEDED), agents=AGENTS, now=0.25)
    assert job_result(effects)["completed_at"] == "1970-01-01T00:00:00.250Z"


# -- property: random DAGs -------------------------------------------------------------------------------


@st.composite
def dags(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, str]]:
    """A random plan (a DAG listed in random order) and each step's outcome."""
    n = draw(st.integers(1, 12))
    ids = [f"s{i}" for i in range(n)]
    # a dependency only on an earlier index keeps it acyclic; the listing order is then shuffled
    deps = [draw(st.lists(st.sampled_from(ids[:i]), unique=True, max_size=3)) if i else [] for i in range(n)]
    listing = draw(st.permutations(range(n)))
    p = plan(*(task(ids[i], draw(st.sampled_from(AGENTS)), tuple(deps[i])) for i in listing))
    outcomes = {sid: draw(st.sampled_from([SUCCEEDED, SUCCEEDED, PARTIAL, FAILED])) for sid in ids}
    return p, outcomes


@settings(max_examples=300, deadline=None)
@given(dags(), st.data())
def test_random_dags_finish_with_every_step_final_and_dependencies_respected(case, data: st.DataObject) -> None:
    """Whatever the DAG and the order results arrive in (with duplicates): each step runs at most once, only after
    its dependencies are done, and the job ends with every step final and the status its steps imply."""
    p, outcomes = case
    deps = {t["id"]: t["depends_on"] for t in p["tasks"]}
    record, effects = submit(p)
    dispatch_count: dict[str, int] = {}
    in_flight: list[str] = []
    answered: list[str] = []

    def note(record: JobRecord, effects: list) -> None:
        for e in effects:
            if isinstance(e, DispatchStep):
                dispatch_count[e.step_id] = dispatch_count.get(e.step_id, 0) + 1
                assert all(record.steps[d]["status"] in (SUCCEEDED, PARTIAL) for d in deps[e.step_id])
                assert set(e.context_data.get("upstream", {})) == set(deps[e.step_id])
                in_flight.append(e.step_id)
        assert JobRecord.from_json(json.loads(json.dumps(record.to_json()))) == record

    note(record, effects)
    for _ in range(200):
        if not in_flight:
            break
        if answered and data.draw(st.booleans(), label="duplicate"):
            again, effects = result(record, data.draw(st.sampled_from(answered), label="dup of"))
            assert again is record and effects == []
            continue
        sid = in_flight.pop(data.draw(st.integers(0, len(in_flight) - 1), label="next result"))
        record, effects = result(record, sid, outcomes[sid])
        answered.append(sid)
        note(record, effects)

    assert record.terminal and not in_flight
    assert all(count == 1 for count in dispatch_count.values())
    final = statuses(record)
    assert set(final.values()) <= {SUCCEEDED, PARTIAL, FAILED, SKIPPED}
    for sid, status in final.items():
        blocked = any(final[d] in (FAILED, SKIPPED) for d in deps[sid])
        assert (status == SKIPPED) == blocked
        assert (sid in dispatch_count) == (not blocked)
        if not blocked:
            assert status == outcomes[sid]
    values = set(final.values())
    expected = SUCCEEDED if values == {SUCCEEDED} else PARTIAL if values & {SUCCEEDED, PARTIAL} else FAILED
    assert record.state == expected
    body = json.loads(record.result)
    sinks = {sid for sid in final if not any(sid in d for d in deps.values())}
    assert set(body["output"]) == {sid for sid in sinks if final[sid] in (SUCCEEDED, PARTIAL)}
    assert list(body["steps"]) == [t["id"] for t in p["tasks"]]


# -- a step's result only from the step's own agent and task --------------------------------


def test_a_result_from_another_agent_than_the_steps_is_refused_with_an_alert() -> None:
    """A producer that sends its own ``<job>/a`` task to another agent cannot answer for step a: the result is
    refused (an alert says why), the step stays dispatched, nothing downstream runs."""
    record, _ = submit(CHAIN)
    got, effects = jobs.on_result(
        record, jobs.StepResult(f"{JOB}/a", SUCCEEDED, output="forged", agent="writer"), agents=AGENTS, now=T0,
    )
    assert got is record and events(effects) == ["alert.job_result_refused"] and dispatched(effects) == []
    assert got.steps["a"]["status"] == DISPATCHED
    accepted, effects = jobs.on_result(
        record, jobs.StepResult(f"{JOB}/a", SUCCEEDED, output="real", agent="researcher"), agents=AGENTS, now=T0,
    )
    assert accepted.steps["a"]["status"] == SUCCEEDED and dispatched(effects) == ["b"]


def test_a_result_of_another_task_than_the_one_dispatched_is_refused() -> None:
    """The job keeps the digest of the task it dispatched for each step (``stamp``): a result of the right agent
    for another payload under the step's task id is refused; the dispatched task's result counts."""
    record, _ = submit(CHAIN)
    record = jobs.stamp(record, {f"{JOB}/a": "d-real"})
    assert record is not None and record.steps["a"]["digest"] == "d-real"
    got, effects = jobs.on_result(
        record, jobs.StepResult(f"{JOB}/a", SUCCEEDED, agent="researcher", digest="d-forged"), agents=AGENTS, now=T0,
    )
    assert got is record and events(effects) == ["alert.job_result_refused"]
    got, effects = jobs.on_result(
        record, jobs.StepResult(f"{JOB}/a", SUCCEEDED, agent="researcher", digest="d-real"), agents=AGENTS, now=T0,
    )
    assert got.steps["a"]["status"] == SUCCEEDED
