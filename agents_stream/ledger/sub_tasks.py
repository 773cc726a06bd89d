"""Agents as tools, the ledger's side: a delegating loop's sub-tasks published, their results sent back to it.

The pure transitions are ``tables/delegation.py``'s. This module builds the sub-tasks' payloads (``parent`` names
the caller's task, app and call; ``lineage`` the chain of callers) and, when a ledger finishes a task that has a
parent, the result event that goes to the parent's outcomes topic (keyed by the parent's task_id: its partition).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from agents_stream.contract import topics
from agents_stream.contract.events import CallsDelegated, SubtaskResult, encode
from agents_stream.contract.models import ParentRef, TaskPayload, sub_task_id, task_digest
from agents_stream.kafka.delivery import Send
from agents_stream.kafka.outbox import Outbox
from agents_stream.ledger import sizes
from agents_stream.ops import tracing
from agents_stream.settings import Settings
from agents_stream.tables import delegation, leases
from agents_stream.tables.leases import TaskRecord

__all__ = ["Delegation", "result_send"]

log = logging.getLogger(__name__)

#: what a transition of the task table returns: the record before, after, and the effects to carry out
Transition = tuple[TaskRecord | None, TaskRecord | None, list[leases.Effect | delegation.SendTask]]


class Delegation:
    def __init__(self, settings: Settings, worker_id: str, outbox: Outbox) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.outbox = outbox

    def on_event(self, task_id: str, record: TaskRecord | None, event: CallsDelegated | SubtaskResult) -> Transition:
        """The transition of a delegation (sub-tasks published) or of a sub-task's result (journaled)."""
        if isinstance(event, SubtaskResult):
            limit = self.settings.record_max_bytes
            arrived = delegation.CallResult(event.task_id, event.call_id, event.agent, event.result, event.digest)
            new, effects = delegation.arrive(
                record, arrived, task_id=task_id, now=time.time(), me=self.worker_id, ttl=self.settings.lease_ttl_s,
                fits=lambda r: sizes.subresult_too_large(r, limit),
            )
            if new is record:
                log.debug("Sub-task result %s for %s changes nothing (a duplicate, not awaited, or not the call's "
                          "own sub-task)", event.task_id, task_id)
            return record, new, effects
        if record is None:
            return record, None, []
        parent = TaskPayload.model_validate_json(record.payload)
        lineage = [*(parent.parent.lineage if parent.parent else []), record.agent]
        subtasks, digests = [], {}
        for call in event.calls:
            sub_id = sub_task_id(task_id, call.id)
            payload = TaskPayload(
                task_id=sub_id, agent_name=call.agent, instruction=call.instruction,
                context_data=call.context or {}, deadline=parent.deadline,
                parent=ParentRef(task_id=task_id, app_id=self.settings.app_id, call_id=call.id, lineage=lineage),
            )
            subtasks.append((call.id, call.agent, sub_id, payload.model_dump_json(exclude_none=True)))
            digests[call.id] = task_digest(payload)  # its result counts only if it ran this very payload
        new, effects = delegation.delegate(
            record, dispatch=event.dispatch, turn=event.turn, subtasks=subtasks, digests=digests,
        )
        return record, new, effects

    def send(self, effect: delegation.SendTask, trace: str | None = None) -> Send:
        """A sub-task, to its agent's task topic (``trace``: the sub-agent call's traceparent, in its headers)."""
        headers = tracing.headers_with(None, trace) if trace is not None else None
        return self.outbox.record(
            topics.task_topic(effect.agent), effect.task_id.encode(), effect.payload.encode(), headers=headers,
        )

    def result_sends(self, record: TaskRecord | None, result: str) -> list[Send]:
        """A finished sub-task's result, to its parent's outcomes topic (any app id; duplicates change nothing)."""
        if record is None or '"parent"' not in record.payload:
            return []
        task = TaskPayload.model_validate_json(record.payload)
        if task.parent is None:
            return []
        digest = record.digest or task_digest(task)
        return [result_send(self.outbox, task, record.agent, digest, json.loads(result))]


def result_send(outbox: Outbox, task: TaskPayload, agent: str, digest: str, result: dict[str, Any]) -> Send:
    """The send of sub-task ``task``'s result to its parent's ledger, with the digest of the task that ran (the
    caller counts it only when that is the payload it delegated: ``tables.delegation.is_from_call``)."""
    assert task.parent is not None
    event = SubtaskResult(task_id=task.task_id, agent=agent, call_id=task.parent.call_id, result=result,
                          digest=digest)
    return outbox.record(topics.outcomes_topic(task.parent.app_id), task.parent.task_id.encode(), encode(event))
