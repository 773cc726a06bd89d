"""The task ledger's state machine (tables/leases.py), every transition without a broker."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from agents_stream.tables import leases
from agents_stream.tables.leases import (
    DEAD_LETTERED,
    FAILED,
    RUNNING,
    SUCCEEDED,
    Control,
    DeadLetter,
    Dispatch,
    EmitResult,
    ReleaseOffsets,
    TaskRecord,
    Track,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

AGENT = "analyzer"
TOPIC = "agent.tasks.analyzer"
PAYLOAD = '{"task_id":"t-1","agent_name":"analyzer","instruction":"sum it up"}'
RESULT = '{"task_id":"t-1","status":"succeeded","output":"42"}'
ME, OTHER = "worker-a", "worker-b"
TTL = 30.0
T0 = 1_000.0


def receive(record: TaskRecord | None, *, now: float = T0, running_here: bool = False, max_attempts: int = 3,
            offset: int = 7, me: str = ME):
    return leases.receive(
        record, leases.TaskMessage(agent=AGENT, payload=PAYLOAD, topic=TOPIC, partition=2, offset=offset),
        now=now, me=me, ttl=TTL, max_attempts=max_attempts, running_here=running_here,
    )


def expire(record: TaskRecord | None, *, dispatch: int, now: float, running_here: bool = False,
           max_attempts: int = 3, me: str = ME, owner_gone: bool = False):
    return leases.expire(record, dispatch=dispatch, now=now, me=me, ttl=TTL,
                         max_attempts=max_attempts, running_here=running_here, owner_gone=owner_gone)


def running(*, dispatch: int = 1, owner: str = OTHER, lease_until: float = T0 + TTL) -> TaskRecord:
    return TaskRecord(
        state=RUNNING, agent=AGENT, dispatch=dispatch, owner=owner, lease_until=lease_until,
        payload=PAYLOAD, topic=TOPIC, partition=2, offset=7, received_at=T0,
    )


def terminal(state: str, result: str | None) -> TaskRecord:
    return replace(running(), state=state, result=result, finished_at=T0 + 5)


# -- receive ---------------------------------------------------------------------------


def test_new_task_is_running_with_first_dispatch() -> None:
    """A first delivery creates a RUNNING record leased to us and dispatches it once, holding its offset."""
    record, effects = receive(None)
    assert effects == [Track(), Dispatch(1)]
    assert record == TaskRecord(
        state=RUNNING, agent=AGENT, dispatch=1, owner=ME, lease_until=T0 + TTL,
        payload=PAYLOAD, topic=TOPIC, partition=2, offset=7, received_at=T0,
    )
    assert not record.terminal


@pytest.mark.parametrize("state", [SUCCEEDED, FAILED, DEAD_LETTERED])
@pytest.mark.parametrize("running_here", [False, True])
def test_redelivered_terminal_task_reemits_its_stored_result(state: str, running_here: bool) -> None:
    """A finished task never reaches a provider again; a redelivery re-emits the stored result byte for byte."""
    rec = terminal(state, RESULT)
    new, effects = receive(rec, now=T0 + 10_000, running_here=running_here)
    assert new == rec
    assert effects == [EmitResult(RESULT)]


@pytest.mark.parametrize("state", [SUCCEEDED, FAILED, DEAD_LETTERED])
def test_redelivered_terminal_task_without_result_does_nothing(state: str) -> None:
    """A terminal task without a stored result (dead-lettered by recovery) is neither re-run nor re-emitted."""
    rec = terminal(state, None)
    new, effects = receive(rec, now=T0 + 10_000)
    assert new == rec
    assert effects == []


@pytest.mark.parametrize("now", [T0, T0 + TTL + 1])
def test_duplicate_while_running_here_only_holds_the_offset(now: float) -> None:
    """A duplicate of a task our executor already runs is not dispatched again, lapsed lease or not; its
    offset is held (a rebalance that gave the partition back dropped the first delivery's hold)."""
    rec = running(owner=ME)
    new, effects = receive(rec, now=now, running_here=True)
    assert new == rec
    assert effects == [Track()]


def test_redelivery_under_live_foreign_lease_only_holds_the_offset() -> None:
    """While another worker's lease is live we only hold the offset and wait for its outcome."""
    rec = running(owner=OTHER, lease_until=T0 + TTL)
    new, effects = receive(rec, now=T0 + TTL - 0.001, offset=99)
    assert new == rec
    assert effects == [Track()]


@pytest.mark.parametrize("dispatch", [1, 3])
def test_redelivery_after_lapsed_lease_still_only_holds_the_offset(dispatch: int) -> None:
    """A redelivery never takes a task over, even past its stored lease (or at max_attempts): after a long
    rebalance the live owner's renewals may still be unread in the outcomes topic. The scanner's `expired`
    event, queued behind them there, takes over or dead-letters (``expire``, below)."""
    rec = running(dispatch=dispatch, owner=OTHER, lease_until=T0 + TTL)
    new, effects = receive(rec, now=T0 + TTL + 1, max_attempts=3)
    assert new == rec
    assert effects == [Track()]


# -- heartbeat ---------------------------------------------------------------------------


def test_heartbeat_extends_the_current_dispatch_lease() -> None:
    """A live executor's heartbeat pushes its lease to now + ttl."""
    rec = running(dispatch=2, owner=ME, lease_until=T0 + TTL)
    new, effects = leases.heartbeat(rec, dispatch=2, owner=ME, now=T0 + 20, ttl=TTL)
    assert effects == []
    assert new == replace(rec, lease_until=T0 + 20 + TTL)


def test_heartbeat_never_shortens_the_lease() -> None:
    """A late or short-ttl heartbeat cannot pull the lease back in time."""
    rec = running(owner=ME, lease_until=T0 + 100)
    new, _ = leases.heartbeat(rec, dispatch=1, owner=ME, now=T0, ttl=5.0)
    assert new.lease_until == T0 + 100


def test_heartbeat_records_the_heartbeating_owner() -> None:
    """The lease belongs to whoever runs the current dispatch."""
    rec = running(owner=OTHER)
    new, _ = leases.heartbeat(rec, dispatch=1, owner=ME, now=T0 + 1, ttl=TTL)
    assert new.owner == ME


@pytest.mark.parametrize("dispatch", [1, 3])
def test_heartbeat_of_another_dispatch_is_ignored(dispatch: int) -> None:
    """A heartbeat from a superseded (or unknown) dispatch does not keep the task's lease alive."""
    rec = running(dispatch=2, owner=ME, lease_until=T0)
    new, effects = leases.heartbeat(rec, dispatch=dispatch, owner=OTHER, now=T0 + 50, ttl=TTL)
    assert new is rec
    assert effects == []


@pytest.mark.parametrize("state", [SUCCEEDED, FAILED, DEAD_LETTERED])
def test_heartbeat_of_terminal_task_is_ignored(state: str) -> None:
    """A finished task's lease is not renewed by a straggling executor."""
    rec = terminal(state, RESULT)
    new, effects = leases.heartbeat(rec, dispatch=1, owner=ME, now=T0 + 50, ttl=TTL)
    assert new is rec
    assert effects == []


def test_heartbeat_of_unknown_task_is_ignored() -> None:
    """A heartbeat for a task the table does not know creates nothing."""
    assert leases.heartbeat(None, dispatch=1, owner=ME, now=T0, ttl=TTL) == (None, [])


# -- finish ---------------------------------------------------------------------------


def test_success_emits_result_and_releases_offsets() -> None:
    """A success stores the result, emits it and releases the held offsets; no dead letter."""
    rec = running(owner=ME)
    new, effects = leases.finish(rec, status=SUCCEEDED, result=RESULT, reason=None, now=T0 + 3)
    assert effects == [EmitResult(RESULT), ReleaseOffsets()]
    assert new == replace(rec, state=SUCCEEDED, result=RESULT, finished_at=T0 + 3)


def test_only_the_outcome_that_ended_a_task_read_again_gives_its_stored_result() -> None:
    """Its first reader may have lost the partition before the result went out: the same run's same outcome read
    again sends the stored result. Another run's, another outcome, a running or unknown task: nothing."""
    done, _ = leases.finish(running(dispatch=2, owner=ME), status=SUCCEEDED, result=RESULT, reason=None, now=T0 + 3)
    assert leases.ended_by(done, dispatch=2, status=SUCCEEDED) == RESULT
    assert leases.ended_by(done, dispatch=1, status=SUCCEEDED) is None, "an earlier run's outcome"
    assert leases.ended_by(done, dispatch=2, status=FAILED) is None, "not the outcome that ended it"
    assert leases.ended_by(replace(done, state=leases.CANCELLED), dispatch=2, status=SUCCEEDED) is None
    assert leases.ended_by(running(dispatch=2, owner=ME), dispatch=2, status=SUCCEEDED) is None
    assert leases.ended_by(None, dispatch=1, status=SUCCEEDED) is None


def test_failure_emits_result_dead_letters_and_releases_offsets() -> None:
    """A failure emits its result, dead-letters the payload as 'downstream' with the dispatch count, alerts,
    then releases its offsets."""
    rec = running(dispatch=2, owner=ME)
    new, effects = leases.finish(rec, status=FAILED, result=RESULT, reason="http_400", now=T0 + 3)
    assert effects == [
        EmitResult(RESULT),
        DeadLetter("http_400", "downstream", 2),
        Control("task.failed", {"reason": "http_400"}),
        ReleaseOffsets(),
    ]
    assert new.state == FAILED
    assert new.result == RESULT
    assert new.terminal


def test_failure_without_reason_is_dead_lettered_as_permanent_error() -> None:
    """A failure that gives no reason still produces a dead-letter reason an operator can read."""
    _, effects = leases.finish(running(), status=FAILED, result=RESULT, reason=None, now=T0)
    (dead,) = [e for e in effects if isinstance(e, DeadLetter)]
    assert dead.reason == "permanent_error"


@pytest.mark.parametrize("first", [SUCCEEDED, FAILED])
@pytest.mark.parametrize("second", [SUCCEEDED, FAILED])
def test_first_outcome_wins(first: str, second: str) -> None:
    """A second outcome for a finished task changes nothing and emits nothing."""
    done, _ = leases.finish(running(), status=first, result=RESULT, reason=None, now=T0)
    again, effects = leases.finish(done, status=second, result="other", reason="late", now=T0 + 9)
    assert again is done
    assert effects == []


def test_finish_after_recovery_dead_letter_is_dropped() -> None:
    """A late outcome of a task already dead-lettered by recovery neither emits nor dead-letters again."""
    rec = terminal(DEAD_LETTERED, None)
    assert leases.finish(rec, status=SUCCEEDED, result=RESULT, reason=None, now=T0) == (rec, [])


def test_finish_of_unknown_task_is_dropped() -> None:
    """An outcome for a task the table does not know creates nothing."""
    assert leases.finish(None, status=SUCCEEDED, result=RESULT, reason=None, now=T0) == (None, [])


# -- expire ---------------------------------------------------------------------------


@pytest.mark.parametrize("dispatch", [1, 3])
def test_expiry_of_stale_dispatch_is_ignored(dispatch: int) -> None:
    """The scanner's expiry of a superseded dispatch does not re-dispatch the current one."""
    rec = running(dispatch=2, lease_until=T0)
    assert expire(rec, dispatch=dispatch, now=T0 + 1000) == (rec, [])


def test_expiry_while_running_here_renews_instead_of_redispatching() -> None:
    """If our executor still holds the task (queued), expiry renews the lease rather than calling the provider twice."""
    rec = running(dispatch=2, owner=OTHER, lease_until=T0)
    new, effects = expire(rec, dispatch=2, now=T0 + 100, running_here=True)
    assert effects == []
    assert new == replace(rec, owner=ME, lease_until=T0 + 100 + TTL)


def test_expiry_before_the_lease_lapsed_does_nothing() -> None:
    """An expiry that arrives while the lease is still live (it was renewed) is ignored."""
    rec = running(lease_until=T0 + TTL)
    assert expire(rec, dispatch=1, now=T0 + TTL - 0.001) == (rec, [])


def test_lapsed_lease_redispatches_with_next_number() -> None:
    """A lapsed lease is taken over: dispatch n+1, leased to us, announced on control."""
    rec = running(dispatch=1, owner=OTHER, lease_until=T0)
    new, effects = expire(rec, dispatch=1, now=T0 + 1)
    assert effects == [Dispatch(2), Control("task.redispatched", {"dispatch": 2, "previous_owner": OTHER,
                                                                  "why": "lease_lapsed"})]
    assert new == replace(rec, dispatch=2, owner=ME, lease_until=T0 + 1 + TTL)


def test_a_lease_whose_owner_left_the_group_is_taken_over_before_it_lapses() -> None:
    """The owner left the group (or released the task): taken over at once, and the control event says why."""
    rec = running(dispatch=1, owner=OTHER, lease_until=T0 + TTL)
    assert expire(rec, dispatch=1, now=T0 + 1) == (rec, []), "a member's lease is waited out"
    new, effects = expire(rec, dispatch=1, now=T0 + 1, owner_gone=True)
    assert effects == [Dispatch(2), Control("task.redispatched", {"dispatch": 2, "previous_owner": OTHER,
                                                                  "why": "owner_left"})]
    assert new.dispatch == 2 and new.owner == ME


@pytest.mark.parametrize("max_attempts", [1, 2, 3, 5])
def test_lapsed_lease_at_max_attempts_dead_letters(max_attempts: int) -> None:
    """After max_attempts dispatches a lapsed lease dead-letters the task ('recovery') and releases its offsets."""
    rec = running(dispatch=max_attempts, lease_until=T0)
    new, effects = expire(rec, dispatch=max_attempts, now=T0 + 1, max_attempts=max_attempts)
    assert new == replace(rec, state=DEAD_LETTERED, finished_at=T0 + 1)
    assert [type(e) for e in effects] == [DeadLetter, Control, ReleaseOffsets]
    assert effects[0].layer == "recovery" and effects[0].attempts == max_attempts
    assert effects[1] == Control("task.dead_lettered", {"layer": "recovery", "attempts": max_attempts})


def test_lapses_walk_dispatch_up_to_max_attempts_then_dead_letter() -> None:
    """A task whose every worker dies is dispatched exactly max_attempts times, then dead-lettered."""
    rec, effects = receive(None, now=T0)
    dispatched = [e.dispatch for e in effects if isinstance(e, Dispatch)]
    now = T0
    while not rec.terminal:
        now = rec.lease_until
        rec, effects = expire(rec, dispatch=rec.dispatch, now=now, max_attempts=3)
        dispatched += [e.dispatch for e in effects if isinstance(e, Dispatch)]
    assert dispatched == [1, 2, 3]
    assert rec.state == DEAD_LETTERED


@pytest.mark.parametrize("state", [SUCCEEDED, FAILED, DEAD_LETTERED])
def test_expiry_of_terminal_task_is_ignored(state: str) -> None:
    """A finished task is never re-dispatched by the scanner."""
    rec = terminal(state, RESULT)
    assert expire(rec, dispatch=1, now=T0 + 10_000) == (rec, [])


def test_expiry_of_unknown_task_is_ignored() -> None:
    """An expiry for a task the table does not know creates nothing."""
    assert expire(None, dispatch=1, now=T0) == (None, [])


# -- the stored record -------------------------------------------------------------------


@pytest.mark.parametrize(
    "rec",
    [running(), terminal(SUCCEEDED, RESULT), terminal(DEAD_LETTERED, None)],
    ids=["running", "succeeded", "dead_lettered"],
)
def test_record_round_trips_through_json(rec: TaskRecord) -> None:
    """What the table stores (JSON, never pickle) reads back as the same record."""
    data = json.loads(json.dumps(rec.to_json()))
    assert TaskRecord.from_json(data) == rec
    assert data["v"] == leases.RECORD_VERSION


def test_record_from_json_ignores_unknown_keys() -> None:
    """A record written by a newer version with extra fields still loads (schema evolution)."""
    data = {**running().to_json(), "priority_lane": "fast", "v": 2}
    rec = TaskRecord.from_json(data)
    assert replace(rec, v=leases.RECORD_VERSION) == running()


def test_dump_is_compact_json_of_the_record() -> None:
    """The log/web view of a record is parseable JSON of exactly its fields."""
    rec = running()
    assert json.loads(leases.dump(rec)) == rec.to_json()


# -- any sequence of events ------------------------------------------------------------------

times = st.floats(min_value=0, max_value=300, allow_nan=False)
dispatches = st.integers(min_value=0, max_value=6)
workers = st.sampled_from([ME, OTHER])


class TaskLedgerMachine(RuleBasedStateMachine):
    """One task_id's record driven by arbitrary deliveries, heartbeats, outcomes and expiries."""

    MAX_ATTEMPTS = 3

    def __init__(self) -> None:
        super().__init__()
        self.record: TaskRecord | None = None
        self.emitted: set[str] = set()
        self.dispatched: list[int] = []
        self.dead_letters = 0
        self.releases = 0
        self.terminal_record: TaskRecord | None = None
        self.max_dispatch_seen = 0

    @initialize(now=times, me=workers)
    def first_delivery(self, now: float, me: str) -> None:
        self.apply(*receive(None, now=now, me=me, max_attempts=self.MAX_ATTEMPTS))

    def apply(self, new: TaskRecord | None, effects: list) -> None:
        old = self.record
        assert new is not None
        if old is not None and old.terminal:
            # Terminal is for ever: no transition changes a finished record.
            assert new == old
        assert new.dispatch >= (old.dispatch if old else 1)
        for e in effects:
            if isinstance(e, EmitResult):
                self.emitted.add(e.result)
            elif isinstance(e, Dispatch):
                self.dispatched.append(e.dispatch)
            elif isinstance(e, DeadLetter):
                self.dead_letters += 1
            elif isinstance(e, ReleaseOffsets):
                self.releases += 1
        self.record = new

    @rule(now=times, me=workers, running_here=st.booleans())
    def delivery(self, now: float, me: str, running_here: bool) -> None:
        self.apply(*receive(self.record, now=now, me=me, running_here=running_here, max_attempts=self.MAX_ATTEMPTS))

    @rule(dispatch=dispatches, owner=workers, now=times, ttl=st.floats(min_value=0.1, max_value=60))
    def heartbeat(self, dispatch: int, owner: str, now: float, ttl: float) -> None:
        self.apply(*leases.heartbeat(self.record, dispatch=dispatch, owner=owner, now=now, ttl=ttl))

    @rule(status=st.sampled_from([SUCCEEDED, FAILED]), n=st.integers(0, 3), now=times)
    def outcome(self, status: str, n: int, now: float) -> None:
        # Each executor run produces its own result text; only the first may ever be emitted.
        self.apply(*leases.finish(self.record, status=status, result=f"result-{status}-{n}", reason=None, now=now))

    @rule(dispatch=dispatches, now=times, me=workers, running_here=st.booleans())
    def expiry(self, dispatch: int, now: float, me: str, running_here: bool) -> None:
        self.apply(*expire(self.record, dispatch=dispatch, now=now, me=me, running_here=running_here,
                           max_attempts=self.MAX_ATTEMPTS))

    @invariant()
    def one_distinct_result(self) -> None:
        """At most one result string is ever emitted, and it is the stored one."""
        assert len(self.emitted) <= 1
        if self.emitted:
            assert self.record.result in self.emitted

    @invariant()
    def dispatches_increase_and_are_bounded(self) -> None:
        """Dispatch numbers only go up, one at a time, never past max_attempts."""
        assert self.dispatched == list(range(1, len(self.dispatched) + 1))
        assert self.record.dispatch == self.dispatched[-1]
        assert self.record.dispatch <= self.MAX_ATTEMPTS

    @invariant()
    def terminal_happens_once(self) -> None:
        """A task's offsets are released and it is dead-lettered at most once, and released exactly when terminal."""
        assert self.releases == (1 if self.record.terminal else 0)
        assert self.dead_letters <= 1
        if self.record.state in (FAILED, DEAD_LETTERED):
            assert self.dead_letters == 1
        else:
            assert self.dead_letters == 0


TaskLedgerMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_task_ledger_state_machine = TaskLedgerMachine.TestCase


# -- requeue from the dead-letter topic (agents-stream dlq requeue) ---------------------------


def requeued(record: TaskRecord | None, requeue_id: str, *, history: str | None = '[{"attempts":"3"}]'):
    message = leases.TaskMessage(agent=AGENT, payload=PAYLOAD, topic=TOPIC, partition=2, offset=40,
                                 requeue_id=requeue_id, history=history)
    return leases.receive(record, message, now=T0 + 100, me=ME, ttl=TTL, max_attempts=3, running_here=False)


@pytest.mark.parametrize("state", [FAILED, DEAD_LETTERED])
def test_requeue_restarts_a_failed_task_with_its_attempts_reset(state: str) -> None:
    """A requeued task that had failed or been dead-lettered runs again from dispatch 1, with its history kept."""
    old = replace(terminal(state, RESULT if state == FAILED else None), dispatch=3)
    new, effects = requeued(old, "rq-1")
    assert new.state == RUNNING and new.dispatch == 1 and new.offset == 40 and new.result is None
    assert new.requeue_id == "rq-1" and new.requeues == 1 and new.history == '[{"attempts":"3"}]'
    assert effects[:2] == [Track(), Dispatch(1)]
    assert effects[2] == Control("task.requeued", {"requeue_id": "rq-1", "requeues": 1})


def test_the_same_requeue_delivered_twice_runs_once() -> None:
    """A redelivered requeue message is an ordinary duplicate: it neither restarts nor re-runs the task."""
    first, _ = requeued(terminal(FAILED, RESULT), "rq-1")
    done = replace(first, state=SUCCEEDED, result=RESULT, finished_at=T0 + 200)
    again, effects = requeued(done, "rq-1")
    assert again == done and effects == [EmitResult(RESULT)]


def test_a_succeeded_task_is_not_restarted_by_a_requeue() -> None:
    """Only failed or dead-lettered tasks restart; a task that succeeded re-emits its result."""
    done = terminal(SUCCEEDED, RESULT)
    assert requeued(done, "rq-9") == (done, [EmitResult(RESULT)])


def test_a_second_requeue_counts_and_a_new_failure_dead_letters_with_its_attempts() -> None:
    """Requeues are counted; a requeued task that fails again is dead-lettered with the attempts of its new run."""
    first, _ = requeued(terminal(DEAD_LETTERED, None), "rq-1")
    failed = replace(first, state=DEAD_LETTERED, finished_at=T0 + 300)
    second, _ = requeued(failed, "rq-2")
    assert second.requeues == 2 and second.dispatch == 1
    _, effects = leases.finish(second, status=FAILED, result=RESULT, reason="permanent_error: 400", now=T0 + 400)
    assert DeadLetter("permanent_error: 400", "downstream", 1) in effects


def test_requeue_of_a_task_never_recorded_starts_it() -> None:
    """A dead letter from layer 1 (never recorded) that is requeued after a fix is received as new, with its history."""
    new, effects = requeued(None, "rq-1")
    assert new.state == RUNNING and new.requeues == 1 and Dispatch(1) in effects


# -- step checkpoints ------------------------------------------------------------------------


def test_step_outputs_are_checkpointed_in_order_and_duplicates_change_nothing() -> None:
    """Each finished step is kept once, in order; a repeated or out-of-order report is ignored."""
    r = running()
    r, effects = leases.checkpoint(r, index=0, output="one")
    assert effects == [] and leases.completed_steps(r) == ["one"]
    assert leases.checkpoint(r, index=0, output="again")[0] == r, "a duplicate of step 0"
    assert leases.checkpoint(r, index=2, output="skip")[0] == r, "step 1 must come first"
    r, _ = leases.checkpoint(r, index=1, output={"two": 2})
    assert leases.completed_steps(r) == ["one", {"two": 2}]


def test_a_redispatch_carries_the_checkpoint_and_finishing_clears_it() -> None:
    """A task taken over after a crash keeps its finished steps;
    when it ends the checkpoint is cleared (the result has them)."""
    r, _ = leases.checkpoint(running(lease_until=T0), index=0, output="one")
    taken, effects = expire(r, dispatch=1, now=T0 + 1)
    assert Dispatch(2) in effects and leases.completed_steps(taken) == ["one"]
    done, _ = leases.finish(taken, status=SUCCEEDED, result=RESULT, reason=None, now=T0 + 2)
    assert done.steps_done is None and leases.completed_steps(done) == []
    assert leases.checkpoint(done, index=1, output="late")[0] == done, "nothing changes once terminal"


# -- the steps a transition added (appended_steps) ----------------------------------------------------------------

_ENTRIES = st.lists(st.one_of(
    st.dictionaries(st.sampled_from(["kind", "text", "content"]), st.text(max_size=5), max_size=3),
    st.text(max_size=5), st.integers(), st.lists(st.integers(), max_size=2)), max_size=4)


def _journal(entries: list[object] | None, compact: bool) -> TaskRecord:
    text = None if entries is None else json.dumps(entries, separators=(",", ":") if compact else None)
    return replace(running(), steps_done=text)


@settings(max_examples=300, deadline=None)
@given(old=st.one_of(st.none(), _ENTRIES), more=_ENTRIES, rewritten=st.one_of(st.none(), _ENTRIES),
       compact=st.booleans())
def test_the_steps_a_transition_added_are_read_from_the_text_it_appended_or_left_to_a_full_compare(
    old: list[object] | None, more: list[object], rewritten: list[object] | None, compact: bool,
) -> None:
    before = _journal(old, compact)
    after = _journal((old or []) + more if rewritten is None else rewritten, compact)
    added = leases.appended_steps(before, after)
    if rewritten is None:
        assert added == more, "a journal that grew: exactly the steps it appended"
    if added is not None:  # whatever it read is what a full compare gives
        assert leases.completed_steps(after) == leases.completed_steps(before) + added
    assert leases.appended_steps(None, after) == leases.completed_steps(after)
