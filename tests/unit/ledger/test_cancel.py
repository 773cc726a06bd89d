"""Cancelling a task: the pure transitions of every state, the ledger applying a cancel decision (the run stopped,
sub-tasks cancelled in turn, a task cancelled before it arrived answered and never run), and the executor
stopping a run wherever it is."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents_stream.tables import cancel, leases
from agents_stream.tables.cancel import CancelTask, StopRun
from agents_stream.tables.definitions import Tables
from faust.types import TP

from agents_stream.contract import topics
from agents_stream.contract.events import Heartbeat, encode
from agents_stream.contract.models import ApprovalDecision, ParentRef, TaskPayload
from agents_stream.execution import run as outcome
from agents_stream.execution.run import Rejected, Run
from agents_stream.ledger.app_agents import AppAgents
from agents_stream.ledger.ledger import Ledger
from agents_stream.ledger.records import parked, timer_key
from agents_stream.ops.notify import Notifier, decision_signed, with_signature
from agents_stream.settings import Settings
from agents_stream.testing.fakellm import FakeLLM, ok
from tests.unit.fake_worker import worker
from tests.unit.ledger_fakes import EVENT_TIMESTAMP, FakeRuns, LedgerHarness, Table, faust_event, recording_outbox

SECRET = "s" * 32
SETTINGS = Settings(approval_secret=SECRET)
MINE = topics.outcomes_topic(SETTINGS.app_id)
TASK = TaskPayload(task_id="t-1", agent_name="lead", instruction="report", job_id="job-9")


def _record(state: str, *, waiting: str | None = None, payload: TaskPayload = TASK) -> leases.TaskRecord:
    return leases.TaskRecord(
        state=state, agent=payload.agent_name, dispatch=2, owner="w1", lease_until=1e12,
        payload=payload.model_dump_json(), topic=topics.task_topic(payload.agent_name), partition=0, offset=4,
        received_at=0.0, waiting=waiting,
    )


def _cancel(record: leases.TaskRecord | None) -> tuple[leases.TaskRecord | None, list[Any]]:
    return cancel.cancel(record, task_id="t-1", by="ops", via="cli", reason="wrong input", now=50.0, result="R")


WAITING = json.dumps({"turn": 1, "calls": {"c2": "summarizer", "c1": "analyzer"}})


# -- the pure transitions -----------------------------------------------------------------------------------------

def test_a_running_task_ends_cancelled_its_run_stopped_and_its_offsets_released() -> None:
    new, effects = _cancel(_record(leases.RUNNING))
    assert new is not None and new.state == leases.CANCELLED and new.terminal and new.result == "R"
    assert new.owner == "" and new.lease_until == 0.0 and new.finished_at == 50.0
    assert json.loads(new.cancel or "") == {"by": "ops", "via": "cli", "reason": "wrong input", "at": 50.0,
                                            "state": "running"}
    assert leases.EmitResult("R") in effects and StopRun() in effects and leases.ReleaseOffsets() in effects


def test_a_parked_task_ends_cancelled_and_a_later_decision_changes_nothing() -> None:
    from agents_stream.tables import approvals

    parked, _ = leases.park(_record(leases.RUNNING), reason="amount", now=0.0, timeouts=[60.0])
    new, effects = _cancel(parked)
    assert new is not None and new.state == leases.CANCELLED
    assert not any(isinstance(e, StopRun) for e in effects), "nothing runs while parked"
    late = approvals.decide(new, decision="approve", by="alice", via="http", comment=None, now=60.0, me="w1",
                            ttl=30.0, rejected_result="X")
    assert late == (new, []), "an approval after the cancel dispatches nothing"


def test_a_task_waiting_for_subtasks_cancels_each_one_still_awaited() -> None:
    new, effects = _cancel(_record(leases.AWAITING_SUBTASKS, waiting=WAITING))
    assert new is not None and new.state == leases.CANCELLED
    assert [e for e in effects if isinstance(e, CancelTask)] == [
        CancelTask("t-1/c1", "analyzer"), CancelTask("t-1/c2", "summarizer")]
    said = next(e for e in effects if isinstance(e, leases.Control))
    assert said.details["subtasks"] == ["t-1/c1", "t-1/c2"] and said.details["was"] == "awaiting_subtasks"


def test_a_finished_or_unknown_task_is_not_changed_by_a_cancel() -> None:
    for state in leases.TERMINAL:
        done = _record(state)
        assert _cancel(done) == (done, [])
    assert _cancel(None) == (None, [])


def test_only_the_cancel_that_ended_a_task_read_again_gives_its_stored_result() -> None:
    ended, _ = _cancel(_record(leases.AWAITING_APPROVAL))
    assert cancel.cancelled_by(ended, by="ops", via="cli", reason="wrong input") == "R"
    assert cancel.cancelled_by(ended, by="lead", via="cli", reason="wrong input") is None, "another person's cancel"
    assert cancel.cancelled_by(ended, by="ops", via="web", reason="wrong input") is None
    assert cancel.cancelled_by(ended, by="ops", via="cli", reason="other") is None
    assert cancel.cancelled_by(_record(leases.SUCCEEDED), by="ops", via="cli", reason="wrong input") is None
    assert cancel.cancelled_by(None, by="ops", via="cli", reason="wrong input") is None


def test_a_task_cancelled_before_it_arrived_is_answered_when_it_comes() -> None:
    early, _ = cancel.before_arrival(agent="analyzer", topic="agent.tasks.analyzer", partition=3, by="ops",
                                     via="caller", reason="r", now=10.0)
    assert early.terminal and early.result is None and early.payload == ""
    assert cancel.cancelled_before_arrival(early) == {"by": "ops", "via": "caller", "reason": "r", "at": 10.0,
                                                      "state": None}
    came, effects = cancel.arrived(early, payload="{}", digest="d", topic="agent.tasks.analyzer", partition=3,
                                   offset=7, now=20.0, result="R")
    assert effects == [leases.EmitResult("R")] and came.result == "R" and came.offset == 7
    assert cancel.cancelled_before_arrival(came) is None, "answered once; a redelivery re-emits the stored result"
    again = leases.TaskMessage(agent="analyzer", payload="{}", topic="agent.tasks.analyzer", partition=3, offset=8)
    assert leases.receive(came, again, now=30.0, me="w1", ttl=30.0, max_attempts=3, running_here=False) == (
        came, [leases.EmitResult("R")])


# -- the ledger -----------------------------------------------------------------------------------------------

def _ledger(record: leases.TaskRecord | None = None, *, agents: set[str] | None = None, tasks: Table | None = None,
            **settings: Any):
    outbox, sent = recording_outbox()
    tasks, timers = tasks if tasks is not None else Table(), Table()
    runs = FakeRuns()
    ledger = Ledger(Settings(approval_secret=SECRET, partitions=1, **settings), executor=runs,
                    worker_id="w1", tables=Tables(tasks=tasks, answers=Table(), jobs=Table(), timers=timers),
                    watermark=outbox.watermark, outbox=outbox, notifier=Notifier(),
                    agents=AppAgents(names=frozenset(agents or ())))
    if record is not None:
        tasks["t-1"] = record.to_json()
        if parked(record):
            timers[timer_key("t-1")] = {"kind": "task"}
    return LedgerHarness(ledger, tasks, sent, runs)


def _decision(task_id: str = "t-1", *, signed: bool = True, **fields: Any) -> bytes:
    """A cancel as people send it: for this app id's task (``app_id=None``: a caller's cancel, naming the agent)."""
    fields.setdefault("app_id", Settings().app_id)
    fields.setdefault("by", "ops")
    decision = ApprovalDecision(task_id=task_id, decision="cancel", via="cli", comment="wrong input", **fields)
    if signed:
        decision = with_signature(SECRET, decision)
    return decision.model_dump_json(exclude_none=True).encode()


async def _spin() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def _sent(sent: list[tuple[str, bytes | None]], topic: str) -> list[dict[str, Any]]:
    return [json.loads(v or b"") for t, v in sent if t == topic]


async def test_the_ledger_cancels_a_running_task_once_and_stops_its_run_after_the_record_is_durable() -> None:
    f = _ledger(_record(leases.RUNNING))
    f.ledger.handle(faust_event(TP(topics.APPROVALS, 0), 3, b"t-1", _decision()))
    await _spin()
    assert f.tasks["t-1"]["state"] == leases.CANCELLED and f.stopped == ["t-1"]
    [result] = _sent(f.sent, topics.RESULTS)
    assert (result["status"], result["source"]) == ("failed", "cancel")
    assert result["error"] == "cancelled by ops: wrong input"
    assert result["job_id"] == "job-9" and result["completed_at"].startswith("2026-12-01T10:00:00")
    assert _sent(f.sent, topics.JOB_EVENTS), "its job hears the step failed"
    f.ledger.handle(faust_event(TP(topics.APPROVALS, 0), 4, b"t-1", _decision(by="lead")))
    late = outcome.rejected(Run(TASK, 2, "w1"), Rejected("permanent_error: 400", "late", "primary:p"))
    f.ledger.handle(faust_event(TP(MINE, 0), 9, b"t-1", encode(late)))
    f.ledger.handle(faust_event(TP(MINE, 0), 10, b"t-1", encode(Heartbeat(worker="w1", dispatch=2, owner="w1"))))
    await _spin()
    assert len(_sent(f.sent, topics.RESULTS)) == 1 and f.tasks["t-1"]["state"] == leases.CANCELLED, (
        "a second cancel and the stopped run's late outcome change nothing"
    )
    ignored = [c for c in _sent(f.sent, topics.CONTROL) if c["event"] == "task.cancel_ignored"]
    assert ignored and ignored[0]["details"]["reason"] == "the task is cancelled already"


async def test_a_cancel_read_again_sends_the_stored_result_and_does_nothing_else() -> None:
    """Its first reader lost the partition before the result went out (a result waits for its record): the next owner
    reads the same cancel again, finds the task it ended, and sends the stored result byte for byte."""
    f = _ledger(_record(leases.AWAITING_APPROVAL))
    f.ledger.handle(faust_event(TP(topics.APPROVALS, 0), 3, b"t-1", _decision()))
    await _spin()
    first = [v for t, v in f.sent if t == topics.RESULTS]
    f.ledger.forget({TP(topics.APPROVALS, 0)})
    f.watermark.start(TP(topics.APPROVALS, 0), 3)  # the next owner (the same table, recovered) reads it again
    f.ledger.handle(faust_event(TP(topics.APPROVALS, 0), 3, b"t-1", _decision()))
    await _spin()
    assert [v for t, v in f.sent if t == topics.RESULTS] == first * 2, "the stored result again, byte for byte"
    assert len([c for c in _sent(f.sent, topics.CONTROL) if c["event"] == "task.cancelled"]) == 1
    assert not [c for c in _sent(f.sent, topics.CONTROL) if c["event"] == "task.cancel_ignored"]


async def test_a_cancel_read_again_for_another_app_id_or_unsigned_is_refused_not_answered() -> None:
    """Read again, the cancel passes the checks it passed the first time (less the task being finished): one naming
    another app id, or unsigned where signatures are required, gets no result sent."""
    for refused in (_decision(app_id="another-app"), _decision(signed=False)):
        f = _ledger(_record(leases.AWAITING_APPROVAL), approval_require_signed=True)
        f.ledger.handle(faust_event(TP(topics.APPROVALS, 0), 3, b"t-1", _decision()))
        await _spin()
        first = [v for t, v in f.sent if t == topics.RESULTS]
        f.ledger.forget({TP(topics.APPROVALS, 0)})
        f.watermark.start(TP(topics.APPROVALS, 0), 4)
        f.ledger.handle(faust_event(TP(topics.APPROVALS, 0), 4, b"t-1", refused))
        await _spin()
        assert [v for t, v in f.sent if t == topics.RESULTS] == first
        assert [c for c in _sent(f.sent, topics.CONTROL) if c["event"] == "task.cancel_ignored"]


async def test_a_cancelled_caller_sends_a_signed_cancel_to_each_subtask_it_waits_for() -> None:
    f = _ledger(_record(leases.AWAITING_SUBTASKS, waiting=WAITING))
    f.ledger.handle(faust_event(TP(topics.APPROVALS, 0), 3, b"t-1", _decision()))
    await _spin()
    cancels = {d["task_id"]: d for d in _sent(f.sent, topics.APPROVALS)}
    assert set(cancels) == {"t-1/c1", "t-1/c2"} and cancels["t-1/c1"]["agent"] == "analyzer"
    sub = ApprovalDecision.model_validate(cancels["t-1/c1"])
    assert sub.decision == "cancel" and sub.via == "caller" and sub.by == "ops"
    assert sub.comment == "wrong input (its caller t-1 was cancelled)"
    assert decision_signed(SECRET, sub.sig, task_id=sub.task_id, decision=sub.decision, by=sub.by, via=sub.via,
                           comment=sub.comment, level=None, parked=None, agent=sub.agent)
    assert not decision_signed(SECRET, sub.sig, task_id=sub.task_id, decision=sub.decision, by=sub.by, via=sub.via,
                               comment=sub.comment, level=None, parked=None, agent="summarizer"), "the agent is signed"
    assert f.stopped == [], "nothing of it runs while it waits"


async def test_a_subtask_cancelled_before_it_arrived_never_runs_and_its_caller_hears() -> None:
    sub = TaskPayload(task_id="t-1/c1", agent_name="analyzer", instruction="analyse",
                      parent=ParentRef(task_id="t-1", app_id="caller-app", call_id="c1", lineage=["lead"]))
    f = _ledger(agents={"analyzer"})
    callers = _decision("t-1/c1", agent="analyzer", app_id=None)  # a caller's cancel names the agent, no app id
    f.ledger.handle(faust_event(TP(topics.APPROVALS, 0), 3, b"t-1/c1", callers))
    await _spin()
    assert f.tasks["t-1/c1"]["state"] == leases.CANCELLED and not _sent(f.sent, topics.RESULTS)
    f.ledger.handle(faust_event(TP("agent.tasks.analyzer", 0), 5, b"t-1/c1", sub.model_dump_json().encode(),
                                timestamp=EVENT_TIMESTAMP + 60))
    await _spin()
    assert f.dispatched == [], "the task never runs"
    [result] = _sent(f.sent, topics.RESULTS)
    assert result["task_id"] == "t-1/c1" and result["error"] == "cancelled by ops: wrong input"
    assert result["completed_at"].startswith("2026-12-01T10:00:00"), "stamped with the cancel's time"
    [back] = _sent(f.sent, topics.outcomes_topic("caller-app"))
    assert back["kind"] == "subtask_result" and back["result"]["error"] == "cancelled by ops: wrong input"
    again = sub.model_dump_json().encode()
    f.ledger.handle(faust_event(TP("agent.tasks.analyzer", 0), 6, b"t-1/c1", again))
    await _spin()
    assert [r["task_id"] for r in _sent(f.sent, topics.RESULTS)] == ["t-1/c1", "t-1/c1"] and f.dispatched == []


async def test_a_cancel_of_an_unseen_task_is_kept_only_when_signed_and_for_an_agent_of_this_app() -> None:
    f = _ledger(agents={"analyzer"})
    f.ledger.handle(faust_event(TP(topics.APPROVALS, 0), 1, b"x", _decision("x", agent="analyzer", signed=False)))
    f.ledger.handle(faust_event(TP(topics.APPROVALS, 0), 2, b"y", _decision("y", agent="writer")))
    f.ledger.handle(faust_event(TP(topics.APPROVALS, 0), 3, b"z", _decision("z")))
    forged = json.loads(_decision("w", agent="writer"))
    forged["agent"] = "analyzer"  # a signed cancel replayed with another agent
    f.ledger.handle(faust_event(TP(topics.APPROVALS, 0), 4, b"w", json.dumps(forged).encode()))
    await _spin()
    assert set(f.tasks) == set(), "an unsigned, foreign or agent-less cancel of an unseen task records nothing"


async def test_a_saga_that_has_done_steps_is_not_cancelled_so_its_compensations_are_not_skipped() -> None:
    started = _record(leases.RUNNING)
    done = leases.TaskRecord(**{**started.to_json(), "steps_done": json.dumps([{"label": "L-1"}])})
    for record, cancelled in ((started, True), (done, False)):
        f = _ledger(record)
        f.ledger.cancellation.sagas.add("lead")
        f.ledger.handle(faust_event(TP(topics.APPROVALS, 0), 3, b"t-1", _decision()))
        await _spin()
        assert (f.tasks["t-1"]["state"] == leases.CANCELLED) is cancelled
    said = [c for c in _sent(f.sent, topics.CONTROL) if c["event"] == "task.cancel_ignored"]
    assert said and said[0]["details"]["reason"].startswith("a saga that has done steps is not cancelled")


async def test_an_unsigned_cancel_is_refused_when_signatures_are_required() -> None:
    f = _ledger(_record(leases.RUNNING), approval_require_signed=True)
    f.ledger.handle(faust_event(TP(topics.APPROVALS, 0), 3, b"t-1", _decision(signed=False)))
    await _spin()
    assert f.tasks["t-1"]["state"] == leases.RUNNING and f.stopped == []
    assert _sent(f.sent, topics.CONTROL)[0]["details"]["reason"].startswith("the cancel is not signed")


# -- the executor -----------------------------------------------------------------------------------------------

async def test_the_executor_stops_a_call_in_flight_and_its_slot_takes_the_next_task() -> None:
    async with FakeLLM([ok("late", latency=5.0), ok("next")], default=None) as p:
        async with worker({"p": p}, {"providers": ["p"]}, settings={"max_in_flight": 1}) as w:
            w.dispatch("t1")
            await w.until(lambda: p.requests, what="the call started")
            w.dispatch("t2")
            w.dispatch("t3")
            w.executor.cancel("t3")  # still queued: never runs
            w.executor.cancel("t1")
            assert (await w.outcome("t2", timeout=3.0))["output"] == "next", "the slot was freed at once"
            await asyncio.sleep(0.2)
            assert not w.executor.has("t1") and not w.executor.has("t3")
    assert w.events("t1") == [] and w.events("t3") == [] and len(p.requests) == 2


class StalledTable(Table):
    """A table whose writes the broker confirms only when the test says so (a stalled broker)."""

    stalled: list[asyncio.Future[Any]]

    def _confirmed(self) -> None:
        self.last_changelog = asyncio.get_running_loop().create_future()
        self.stalled.append(self.last_changelog)


async def test_a_dispatch_confirmed_after_a_cancel_of_its_task_does_not_start_the_run() -> None:
    """A dispatch confirmed after a cancel: the task's lease write and a later cancel both wait on a stalled broker;
    the lease write is confirmed last (an outbox re-send). The run must not start: the record, cancelled, decides."""
    tasks = StalledTable()
    tasks.stalled = []
    f = _ledger(agents={"lead"}, tasks=tasks)
    home = TP(topics.task_topic("lead"), 0)
    f.ledger.watermark.start(home, 0)
    f.ledger.handle(faust_event(home, 0, b"t-1", TASK.model_dump_json().encode()))
    assert tasks["t-1"]["state"] == leases.RUNNING and f.dispatched == []
    f.ledger.handle(faust_event(TP(topics.APPROVALS, 0), 3, b"t-1", _decision()))
    assert tasks["t-1"]["state"] == leases.CANCELLED
    for fut in reversed(tasks.stalled):  # the cancel is confirmed first, the lease write after it
        fut.set_result("ok")
        await _spin()
    assert f.dispatched == [], "a cancelled task's run never starts"
    [result] = _sent(f.sent, topics.RESULTS)
    assert result["source"] == "cancel"
