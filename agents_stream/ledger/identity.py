"""One task id, one task: a message whose task_id is recorded for another agent or payload is dead-lettered."""

from __future__ import annotations

import logging

from faust.types import TP

from agents_stream.contract import topics
from agents_stream.contract.errors import PoisonMessage
from agents_stream.contract.events import FannedInResult
from agents_stream.contract.models import TaskPayload, task_digest
from agents_stream.kafka.outbox import Outbox
from agents_stream.ledger.poison import Poison
from agents_stream.ledger.sub_tasks import result_send
from agents_stream.orchestrator import fan_in_event
from agents_stream.tables import leases
from agents_stream.tables.leases import TaskRecord

__all__ = ["REASON", "recorded_digest", "refuse_conflict", "task_digest"]

log = logging.getLogger(__name__)

#: the dead letter's error_reason
REASON = "task_id_conflict"


def recorded_digest(record: TaskRecord) -> str | None:
    """The digest of the task ``record`` holds: stored with it, or computed from its payload (a record written
    before digests were stored); None when that payload no longer parses (then only the agent is compared)."""
    if record.digest is not None:
        return record.digest
    try:
        return task_digest(TaskPayload.model_validate_json(record.payload))
    except ValueError:
        return None


def refuse_conflict(
    poison: Poison, outbox: Outbox, tp: TP, offset: int, task: TaskPayload, digest: str, record: TaskRecord | None,
    value: bytes, headers: object,
) -> bool:
    """True when ``task`` is another task than the one its task_id is recorded for: its message is dead-lettered
    (``task_id_conflict``, exactly once across redeliveries) and an alert sent; it is never answered with the
    recorded task's result. A task of a job also tells the job it failed, under its own agent and digest; a
    sub-task tells its caller so."""
    agent = task.agent_name
    why = leases.conflict(
        record, agent=agent, digest=digest, recorded_digest=recorded_digest(record) if record is not None else None,
    )
    if why is None or record is None:
        return False
    log.warning(
        "Task %s at %s[%d]@%d is not the task recorded under its id (%s): dead-lettered as %s, not answered. Check "
        "the producer: task ids must be unique per task", task.task_id, tp.topic, tp.partition, offset, why, REASON,
    )
    outbox.control(
        "alert.task_id_conflict", task.task_id, agent,
        {"reason": why, "recorded_agent": record.agent, "topic": tp.topic, "partition": tp.partition,
         "offset": offset},
    )
    key = task.task_id.encode("utf-8")
    poison.on_message(tp, offset, agent, key, value, headers, PoisonMessage(REASON, why))
    failed = FannedInResult(task_id=task.task_id, status="failed", error=f"dead-lettered: {REASON}: {why}")
    sends = []
    if task.job_id:  # the job hears its task failed (it counts it only if this is the task it dispatched)
        event = fan_in_event(failed, agent, digest)
        sends.append(outbox.record(topics.JOB_EVENTS, task.job_id.encode("utf-8"), event))
    if task.parent is not None:  # so does its caller, under its digest: only the caller of this very payload
        # counts it (a task that took a caller's sub-task id first cannot leave that caller waiting forever)
        sends.append(result_send(outbox, task, agent, digest, failed.model_dump(mode="json", exclude_none=True)))
    if sends:
        outbox.deliver(tp, offset, sends)
    return True

