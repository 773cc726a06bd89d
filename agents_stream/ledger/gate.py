"""The approval gate: which tasks wait for a human, decisions and escalations, webhook notifications, /approvals."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from faust.types import TP

from agents_stream.config import ApprovalPolicy
from agents_stream.contract import topics
from agents_stream.contract.errors import PoisonMessage
from agents_stream.contract.models import ApprovalDecision, TaskPayload, TaskResult, parse_json_model, utcnow_iso
from agents_stream.kafka.outbox import Outbox
from agents_stream.ledger.intake import moved
from agents_stream.ledger.poison import dead_letter_unreadable
from agents_stream.ledger.records import record_of
from agents_stream.ops.notify import Notifier, link, slack_message
from agents_stream.settings import Settings
from agents_stream.tables import approvals, leases
from agents_stream.tables.definitions import LedgerTable
from agents_stream.tables.leases import AWAITING_APPROVAL, TaskRecord

log = logging.getLogger(__name__)

#: what a transition of the task table returns: the record before, after, and the effects to carry out
Transition = tuple[TaskRecord | None, TaskRecord | None, list[leases.Effect]]


class ApprovalGate:
    """Approval policies by agent, and the transitions decisions and timeouts make (applied by the ledger)."""

    def __init__(
        self, settings: Settings, worker_id: str, table: LedgerTable, outbox: Outbox, notifier: Notifier, *,
        policies: dict[str, ApprovalPolicy], saga_flagged: set[str],
    ) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.table = table
        self.outbox = outbox
        self.notifier = notifier
        self.policies = policies
        #: the agents whose saga has a step flagged for approval
        self.saga_flagged = saga_flagged

    def approval_for(self, task: TaskPayload) -> tuple[str, list[float]] | None:
        """(why, each level's timeout) when the agent's policy wants a human to approve this task first."""
        policy = self.policies.get(task.agent_name)
        if policy is None:
            return None
        reason = approvals.needs_approval(
            always=policy.always,
            risk_at_least=policy.risk_at_least,
            amount_field=policy.amount_field,
            amount_above=policy.amount_above,
            saga_flagged=policy.saga_steps and task.agent_name in self.saga_flagged,
            risk_level=task.risk_level,
            context_data=task.context_data,
        )
        return (reason, [level.timeout_s for level in policy.levels]) if reason else None

    def on_decision(
        self, tp: TP, offset: int, key: bytes | None, value: bytes | None, headers: Any,
    ) -> tuple[str, Transition] | None:
        """A decision on ``agent.approvals``: (task_id, its transition), or None when it changes nothing here."""
        try:
            decision: ApprovalDecision = parse_json_model(value, ApprovalDecision, self.settings.payload_max_bytes)
        except PoisonMessage as poison:
            dead_letter_unreadable(
                self.outbox, tp, offset, key, value, poison, what="approval decision",
                topic=topics.dlq_of(topics.APPROVALS),
            )
            return None
        if moved(self.outbox, self.settings.partitions, tp, offset, decision.task_id, value, headers):
            return None
        record = record_of(self.table, decision.task_id)
        if record is None:
            # Every app id reads the decisions; the one that has the task applies it.
            log.debug("Decision for %s is not for a task of this app; ignored", decision.task_id)
            return None
        if record.state != AWAITING_APPROVAL:
            log.info(
                "Decision %s by %s for %s ignored: the task is %s (decided before, or timed out)",
                decision.decision, decision.by, decision.task_id, record.state,
            )
            details = {"decision": decision.decision, "by": decision.by, "state": record.state}
            self.outbox.control("approval.ignored", decision.task_id, record.agent, details)
            return None
        new, effects = approvals.decide(
            record, decision=decision.decision, by=decision.by, via=decision.via, comment=decision.comment,
            now=time.time(), me=self.worker_id, ttl=self.settings.lease_ttl_s,
            rejected_result=self._rejected_json(decision.task_id, record, decision.by),
        )
        return decision.task_id, (record, new, effects)

    def on_timeout(self, task_id: str, record: TaskRecord | None, level: int) -> Transition | None:
        """A level's time ran out (an ``approval_timeout`` event): escalate, or reject after the last level."""
        if record is None:
            return None
        policy = self.policies.get(record.agent)
        new, effects = approvals.escalate(
            record, level=level, timeouts=[lv.timeout_s for lv in policy.levels] if policy else [], now=time.time(),
            rejected_result=self._rejected_json(task_id, record, "timeout"),
        )
        return record, new, effects

    def _rejected_json(self, task_id: str, record: TaskRecord, by: str) -> str:
        payload = json.loads(record.payload)
        return TaskResult(
            task_id=task_id, agent_name=record.agent, status="failed", output=None, confidence="failed",
            source="approval", attempts=0, job_id=payload.get("job_id"),
            error=f"rejected by {by}" if by != "timeout" else "rejected: no approval before the last level's timeout",
            completed_at=utcnow_iso(),
        ).model_dump_json()

    def notify(self, task_id: str, record: TaskRecord, level: int) -> None:
        """Tell the level's webhook (best effort: a lost notification still times out and escalates)."""
        policy = self.policies.get(record.agent)
        if policy is None or level >= len(policy.levels):
            return
        rung = policy.levels[level]
        url = rung.webhook_url()
        if not url:
            log.info(
                "Task %s awaits approval at level %d (%s), which has no webhook configured", task_id, level + 1,
                rung.name,
            )
            return
        state = approvals.state(record)
        due = float(state.get("due", 0.0))
        links = None
        secret = self.settings.approval_secret
        if secret:
            base = self.settings.link_base()
            links = {d: link(base, secret, task_id, d, level, rung.name, int(due)) for d in ("approve", "reject")}
        instruction = json.loads(record.payload).get("instruction", "")
        body = slack_message(
            task_id=task_id, agent=record.agent, reason=state.get("reason", ""), level=level, level_name=rung.name,
            due=due, instruction=instruction, links=links,
        )
        self.notifier.notify(url, body, subject=f"task {task_id} level {level + 1}")

    def describe(self, task_id: str, record: TaskRecord) -> dict[str, Any]:
        """One waiting approval, as /approvals lists it."""
        state = approvals.state(record)
        policy = self.policies.get(record.agent)
        level = state.get("level", 0)
        payload = json.loads(record.payload)
        return {
            "task_id": task_id, "agent": record.agent, "reason": state.get("reason"), "level": level + 1,
            "level_name": policy.levels[level].name if policy and level < len(policy.levels) else None,
            "requested_at": state.get("requested_at"), "due": state.get("due"),
            "escalations": state.get("escalations", []),
            "instruction": payload.get("instruction", ""), "context_data": payload.get("context_data", {}),
        }
