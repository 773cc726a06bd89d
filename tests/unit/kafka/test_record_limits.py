"""The record size limits agree at start (kafka/admin.size_problems), and an outcome too big for a record becomes
the task's result_too_large failure on the executor (execution/run.within) — pure, no broker."""

from __future__ import annotations

from agents_stream.tables import leases
from hypothesis import given, settings
from hypothesis import strategies as st

from agents_stream.contract.events import TaskFailed
from agents_stream.contract.models import TaskPayload
from agents_stream.execution import run as outcome
from agents_stream.execution.run import Answer, Run
from agents_stream.kafka.admin import size_problems
from agents_stream.kafka.delivery import RECORD_OVERHEAD_BYTES
from agents_stream.ledger import sizes
from agents_stream.settings import Settings


def test_the_defaults_agree_with_a_default_broker() -> None:
    """Kafka's default max.message.bytes (1048588) takes the default record limit (1000000)."""
    assert size_problems(Settings(), {"agent.results": 1048588, "agent.outcomes.x": 1048588}) == []


def test_a_topic_that_takes_smaller_records_is_named_with_what_to_set() -> None:
    """A topic whose max.message.bytes is below the record limit would refuse records the worker sends: the
    problem names the topic and both ways out."""
    [problem] = size_problems(Settings(), {"agent.results": 500_000, "agent.outcomes.x": 2_000_000})
    assert "agent.results=500000" in problem and "agent.outcomes.x" not in problem
    assert "AGENTS_STREAM_RECORD_MAX_BYTES" in problem and "max.message.bytes=1000000" in problem


def test_a_payload_limit_that_leaves_no_room_for_an_answer_is_refused() -> None:
    """A task and its answer must fit in one record: payload + answer limits over the record limit is a problem."""
    settings = Settings(payload_max_bytes=900_000, answer_max_bytes=262_144, record_max_bytes=1_000_000)
    [problem] = size_problems(settings, {})
    assert problem.startswith("AGENTS_STREAM_PAYLOAD_MAX_BYTES (900000) + AGENTS_STREAM_ANSWER_MAX_BYTES")


def test_an_outcome_too_big_for_one_record_is_sent_as_result_too_large() -> None:
    """The executor never sends an outcome Kafka would refuse: too big, it is the task's failure instead."""
    run = Run(TaskPayload(task_id="t", agent_name="a", instruction="i"), 1, "w")
    small = outcome.succeeded(run, Answer("x" * 1000, "high", "primary:p:m"))
    big = outcome.succeeded(run, Answer("x" * 200_000, "high", "primary:p:m"))
    assert outcome.within(run, small, 100_000) is small
    failed = outcome.within(run, big, 100_000)
    assert isinstance(failed, TaskFailed) and failed.reason.startswith("result_too_large: ")
    assert failed.source == "primary:p:m"


_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=300)


@settings(max_examples=300, deadline=None)
@given(payload=_TEXT, answer=_TEXT, steps=st.one_of(st.none(), _TEXT), room=st.integers(-600, 600))
def test_a_record_is_result_too_large_exactly_when_its_changelog_record_would_not_fit(
    payload: str, answer: str, steps: str | None, room: int,
) -> None:
    """Whatever its characters (quotes, control characters, emoji: JSON escapes them), a finished task's record
    is refused exactly when its bytes pass the limit; the quick bound that skips the count never lets one through."""
    record = leases.TaskRecord(
        state=leases.SUCCEEDED, agent="a", dispatch=1, owner="w", lease_until=0.0, payload=payload,
        topic="agent.tasks.a", partition=0, offset=0, received_at=0.0, result=answer, steps_done=steps,
    )
    event = outcome.succeeded(Run(TaskPayload(task_id="t", agent_name="a", instruction="i"), 1, "w"),
                              Answer(answer, "high", "primary:p"))
    exact = sizes.record_bytes(record) + RECORD_OVERHEAD_BYTES
    for limit in (exact + room, 12 * (len(payload) + len(answer) + len(steps or "")) + room + RECORD_OVERHEAD_BYTES):
        refused = sizes.oversize(record, event, limit)
        assert (refused is not None) == (exact > limit)
