"""Cancelling a task, the ledger's side: a ``cancel`` decision on ``agent.approvals`` applied to the task's record,
the cancels of its sub-tasks sent, and a task cancelled before it arrived answered when it comes.

The pure transitions are ``tables/cancel.py``'s. Every app id reads ``agent.approvals``; the one that has the
task's record applies the cancel. A cancel that names the task's agent and is signed is also recorded by an app
running that agent before the task arrived (a sub-task or a job's step still waiting in its topic).

A cancel is for a task, not for one parking: it names no ``parked``. People's cancels (HTTP, CLI, console) name
the app id they were sent to, and another app id holding the same task id ignores them. A cancel naming no app id
must name the agent, checked against the task's: that is a caller's cancel of its sub-task or a job's of its step,
which is for that task wherever it runs (every app id that runs it runs it for that caller).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from typing import Any

from faust.types import TP

from agents_stream.contract import topics
from agents_stream.contract.models import ApprovalDecision
from agents_stream.kafka.delivery import Send
from agents_stream.kafka.outbox import Outbox
from agents_stream.ledger.records import cancelled_result_json
from agents_stream.ops.notify import with_signature
from agents_stream.settings import Settings
from agents_stream.tables import cancel, leases
from agents_stream.tables.cancel import CancelTask, StopRun
from agents_stream.tables.leases import TaskRecord

__all__ = ["Cancellation", "CancelTask", "StopRun"]

log = logging.getLogger(__name__)

#: what a transition of the task table returns: the record before, after, and the effects to carry out
Transition = tuple[TaskRecord | None, TaskRecord | None, list[Any]]

NO_REASON = "no reason given"


class Cancellation:
    def __init__(self, settings: Settings, outbox: Outbox, agents: set[str], sagas: set[str] | None = None) -> None:
        self.settings = settings
        self.outbox = outbox
        #: the agents this app runs: a signed cancel naming one is recorded before its task arrived
        self.agents = agents
        #: the agents that run sagas: one that has done steps is not cancelled (its compensations would be skipped)
        self.sagas = sagas or set()

    def on_decision(
        self, tp: TP, decision: ApprovalDecision, record: TaskRecord | None, signed: bool, at: float | None,
    ) -> Transition | None:
        """The transition of a cancel for ``record``'s task, or None when it changes nothing here."""
        task_id, by, reason = decision.task_id, decision.by, decision.comment or NO_REASON
        now = at if at is not None and at > 0 else _now()
        if record is None:
            if decision.app_id not in (None, self.settings.app_id):
                log.debug("Cancel of %s is for app id %s; ignored", task_id, decision.app_id)
                return None
            if decision.agent is None or decision.agent not in self.agents:
                log.debug("Cancel of %s is not for a task of this app; ignored", task_id)
                return None
            if not signed:
                log.warning(
                    "Unsigned cancel of %s by %r, a task of %s not seen here yet, ignored: only a signed cancel is "
                    "recorded before its task arrives (send it with AGENTS_STREAM_APPROVAL_SECRET set)",
                    task_id, by, decision.agent,
                )
                return None
            log.info("Task %s of %s is cancelled by %s before it arrived: it will not run", task_id, decision.agent, by)
            recorded, said = cancel.before_arrival(
                agent=decision.agent, topic=topics.task_topic(decision.agent), partition=tp.partition, by=by,
                via=decision.via, reason=reason, now=now,
            )
            return None, recorded, list(said)
        again = cancel.cancelled_by(record, by=by, via=decision.via, reason=reason)
        refused = self._refusal(record, decision, signed, again=again is not None)
        if refused is not None:
            log.info("Cancel of %s by %r (via %s) ignored: %s", task_id, by, decision.via, refused)
            self.outbox.control("task.cancel_ignored", task_id, record.agent,
                                {"by": by, "via": decision.via, "signed": signed, "reason": refused})
            return None
        if again is not None:  # the stored result, as for a redelivered task
            return record, record, [leases.EmitResult(again)]
        if not signed:
            log.warning(
                "Cancel of %s by %r (via %s) carries no valid signature; applied (set AGENTS_STREAM_APPROVAL_SECRET "
                "where cancels are sent to sign them, and AGENTS_STREAM_APPROVAL_REQUIRE_SIGNED=1 to refuse unsigned "
                "ones)", task_id, by, decision.via,
            )
        log.info("Task %s (%s) is cancelled by %s via %s: %s", task_id, record.state, by, decision.via, reason)
        result = cancelled_result_json(task_id, record, cancel.reason_of(by, reason), now)
        new, effects = cancel.cancel(record, task_id=task_id, by=by, via=decision.via, reason=reason, now=now,
                                     result=result)
        return record, new, list(effects)

    def _refusal(self, record: TaskRecord, decision: ApprovalDecision, signed: bool, *, again: bool) -> str | None:
        """Why this cancel is not applied, or None. ``again``: it is the cancel that ended the task, read again; it
        passes the same checks as the first time, less the task being finished."""
        if decision.app_id is not None and decision.app_id != self.settings.app_id:
            return f"the cancel is for the task of this id in app id {decision.app_id}; this is app id " \
                   f"{self.settings.app_id}"
        if decision.app_id is None and decision.agent is None:
            return ("the cancel names no app_id and no agent: a cancel names the app id it is for (the console, "
                    "POST /tasks/<id>/cancel and agents-stream tasks cancel do), or the task's agent")
        if decision.agent is not None and decision.agent != record.agent:
            return f"the cancel is for a task of agent {decision.agent}; this task is agent {record.agent}'s"
        if record.terminal and not again:
            return f"the task is {record.state} already"
        if record.agent in self.sagas and leases.completed_steps(record):
            return ("a saga that has done steps is not cancelled: it completes, or compensates when a step fails "
                    "(a cancel would leave its done steps without their compensations)")
        if not signed and self.settings.approval_require_signed:
            return "the cancel is not signed and AGENTS_STREAM_APPROVAL_REQUIRE_SIGNED is set"
        return None

    def on_arrival(
        self, tp: TP, offset: int, task_id: str, record: TaskRecord | None, value: bytes, digest: str | None,
    ) -> Transition | None:
        """A task that was cancelled before it arrived came: it is answered with its cancelled result (not run)."""
        made = cancel.cancelled_before_arrival(record)
        if made is None or record is None:
            return None
        log.info("Task %s arrived after it was cancelled by %s: answered as cancelled, not run", task_id, made["by"])
        payload = value.decode("utf-8")
        error = cancel.reason_of(str(made["by"]), str(made["reason"]))
        result = cancelled_result_json(task_id, replace(record, payload=payload), error,
                                  float(made["at"]))
        new, effects = cancel.arrived(record, payload=payload, digest=digest, topic=tp.topic, partition=tp.partition,
                                      offset=offset, now=_now(), result=result)
        return record, new, list(effects)

    def send(self, effect: CancelTask, parent_id: str, record: TaskRecord | None) -> Send:
        """The cancel of a cancelled task's sub-task, signed, to ``agent.approvals`` (every app id reads it)."""
        made = json.loads(record.cancel) if record is not None and record.cancel else {}
        by = str(made.get("by") or "unknown")
        reason = f"{made.get('reason') or NO_REASON} (its caller {parent_id} was cancelled)"
        decision = ApprovalDecision(task_id=effect.task_id, decision="cancel", by=by, via="caller",
                                    comment=reason[:2000], agent=effect.agent)
        signed = with_signature(self.settings.approval_secret, decision)
        body = signed.model_dump_json(exclude_none=True).encode("utf-8")
        return self.outbox.record(topics.APPROVALS, effect.task_id.encode("utf-8"), body)


def _now() -> float:
    return time.time()

