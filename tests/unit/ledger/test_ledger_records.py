"""The ledger keeps a task's record one Kafka record, and one task id one task.

Without a broker: the ledger's sends are recorded and confirmed at once; asserted on the stored record, the
result and dead letters it sends, and the alerts.
"""

from __future__ import annotations

import json
from typing import Any

from agents_stream.tables import leases

from agents_stream.contract import topics
from agents_stream.contract.events import StepDone, TaskSucceeded, encode
from agents_stream.contract.models import Usage
from agents_stream.ledger.poison import DEAD_LETTER_REQUEST
from agents_stream.settings import Settings
from tests.unit.ledger_fakes import LedgerWorld

SETTINGS = Settings(partitions=1)
OUTCOMES = topics.outcomes_topic(SETTINGS.app_id)



class World(LedgerWorld):
    """A ledger on one partition (tests/unit/ledger_fakes.LedgerWorld), and the control events it sent."""

    def __init__(self, settings: Settings = SETTINGS) -> None:
        super().__init__(settings)

    def alerts(self) -> list[str]:
        return [json.loads(v or b"{}")["event"] for v in self.on(topics.CONTROL)]


def _task(agent: str = "a", **fields: Any) -> bytes:
    return json.dumps({"task_id": "t1", "agent_name": agent, "instruction": "Sum it up.", **fields}).encode()


def _succeeded(output: Any) -> bytes:
    return encode(TaskSucceeded(
        worker="w1", dispatch=1, calls=1, usage=Usage(), route=None, status="succeeded", output=output,
        confidence="high", source="primary:p:m", partial=False,
    ))


# -- records too large --------------------------------------------------------------------------------------


async def test_a_result_too_large_for_one_record_is_stored_and_sent_as_failed_result_too_large() -> None:
    """An answer that would make the task's record bigger than AGENTS_STREAM_RECORD_MAX_BYTES is not kept: the
    task ends failed (error result_too_large), with a dead letter, and nothing sent is over the limit."""
    world = World(Settings(partitions=1, record_max_bytes=100_000))
    await world.deliver("agent.tasks.a", b"t1", _task())
    await world.deliver(OUTCOMES, b"t1", _succeeded("x" * 150_000))
    record = world.record("t1")
    result = json.loads(record.result or "{}")
    assert record.state == leases.FAILED
    assert result["status"] == "failed" and result["error"].startswith("result_too_large: ")
    assert [json.loads(v or b"{}")["error"] for v in world.on(topics.RESULTS)] == [result["error"]]
    dead = [dict(h)["error_reason"].decode() for t, _, _, h in world.sent if t == topics.dlq_topic("a")]
    assert dead == [result["error"]]
    assert max(len(v or b"") for _, _, v, _ in world.sent) < 100_000


async def test_a_checkpoint_that_would_outgrow_the_record_ends_the_task_failed() -> None:
    """Each step's answer is kept in the task's record: the checkpoint that would pass the limit is not
    written; the task ends failed with result_too_large instead (and later steps' reports change nothing)."""
    world = World(Settings(partitions=1, record_max_bytes=100_000))
    await world.deliver("agent.tasks.a", b"t1", _task(steps=["one", "two", "three"]))
    for index in range(3):
        step = StepDone(worker="w1", dispatch=1, index=index, output="y" * 40_000)
        await world.deliver(OUTCOMES, b"t1", encode(step))
    record = world.record("t1")
    assert record.state == leases.FAILED and record.steps_done is None
    assert json.loads(record.result or "{}")["error"].startswith("result_too_large: with the checkpoint of step 3")
    assert len(world.on(topics.RESULTS)) == 1 and len(world.on(topics.dlq_topic("a"))) == 1


# -- one task id, one task ----------------------------------------------------------------------------------


async def _answered_world() -> World:
    """Task t1 of agent a, answered."""
    world = World()
    await world.deliver("agent.tasks.a", b"t1", _task())
    await world.deliver(OUTCOMES, b"t1", _succeeded("the sum"))
    assert world.record("t1").state == leases.SUCCEEDED and len(world.on(topics.RESULTS)) == 1
    return world


async def test_a_task_id_sent_again_for_another_agent_is_dead_lettered_not_answered() -> None:
    """t1 is recorded for agent a; a message of t1 for agent b gets no one's result: it is dead-lettered as
    task_id_conflict (asked for through the outcomes topic, as every layer-1 dead letter) with an alert."""
    world = await _answered_world()
    await world.deliver("agent.tasks.b", b"t1", _task(agent="b"))
    assert len(world.on(topics.RESULTS)) == 1, "the recorded task's result is not sent for another task"
    assert world.on(OUTCOMES) == [DEAD_LETTER_REQUEST]
    assert "alert.task_id_conflict" in world.alerts()
    assert world.record("t1").agent == "a" and [d[0] for d in world.dispatched] == ["t1"]


async def test_a_task_id_sent_again_with_another_payload_is_dead_lettered_not_answered() -> None:
    """Same agent, another instruction under the same task id: another task, dead-lettered as task_id_conflict."""
    world = await _answered_world()
    await world.deliver("agent.tasks.a", b"t1", _task(instruction="Delete everything."))
    assert len(world.on(topics.RESULTS)) == 1
    assert world.on(OUTCOMES) == [DEAD_LETTER_REQUEST]
    assert "alert.task_id_conflict" in world.alerts()


async def test_a_true_redelivery_of_the_same_task_replays_its_stored_result() -> None:
    """The same task again (other key order, an unknown field): the stored result goes out again, byte for byte;
    no dead letter, no alert, no second call."""
    world = await _answered_world()
    again = json.dumps({"instruction": "Sum it up.", "agent_name": "a", "task_id": "t1", "newer_field": 1}).encode()
    await world.deliver("agent.tasks.a", b"t1", again)
    first, second = world.on(topics.RESULTS)
    assert first == second
    assert world.on(OUTCOMES) == [] and "alert.task_id_conflict" not in world.alerts()
    assert [d[0] for d in world.dispatched] == ["t1"]


async def test_a_conflicting_task_of_a_job_tells_the_job_it_failed_under_its_own_identity() -> None:
    """A job's task refused as a conflict (another task took its id first) fails its step with the reason: the job
    hears of it with the refused task's agent and digest, so it counts only if that is the task it dispatched."""
    from agents_stream.contract.events import JOB_EVENTS, JobTaskResult, decode
    from agents_stream.contract.models import TaskPayload, task_digest

    world = World()
    await world.deliver("agent.tasks.a", b"t1", _task(job_id="j1", instruction="forged"))
    real = _task(job_id="j1")
    await world.deliver("agent.tasks.a", b"t1", real)
    [event] = [decode(v, JOB_EVENTS) for v in world.on(topics.JOB_EVENTS)]
    assert isinstance(event, JobTaskResult) and event.result.status == "failed"
    assert (event.result.error or "").startswith("dead-lettered: task_id_conflict: ")
    assert event.agent_name == "a" and event.task_digest == task_digest(TaskPayload.model_validate_json(real))
