"""The approval gate: which tasks wait for a human (within a cap), signed decisions bound to one parking,
escalations, webhook notifications, /approvals."""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

from faust.types import TP

from agents_stream.config import ApprovalPolicy
from agents_stream.contract import topics
from agents_stream.contract.errors import PoisonMessage
from agents_stream.contract.events import CallParked
from agents_stream.contract.models import ApprovalDecision, TaskPayload, TaskResult, parse_json_model, utcnow_iso
from agents_stream.kafka.outbox import Outbox
from agents_stream.ledger.cancel_decisions import Cancellation
from agents_stream.ledger.intake import moved
from agents_stream.ledger.poison import dead_letter_unreadable
from agents_stream.ledger.records import record_of
from agents_stream.ops.notify import Notifier, decision_signed, link, slack_message
from agents_stream.settings import Settings
from agents_stream.tables import approvals, leases, route_journal
from agents_stream.tables.definitions import KeyedTable
from agents_stream.tables.leases import AWAITING_APPROVAL, TaskRecord

log = logging.getLogger(__name__)

#: what a transition of the task table returns: the record before, after, and the effects to carry out
Transition = tuple[TaskRecord | None, TaskRecord | None, list[leases.Effect]]


class ApprovalGate:
    """Approval policies by agent, and the transitions decisions and timeouts make (applied by the ledger)."""

    def __init__(
        self, settings: Settings, worker_id: str, table: KeyedTable, outbox: Outbox, notifier: Notifier, *,
        policies: dict[str, ApprovalPolicy], saga_flagged: set[str], awaiting_in: Callable[[TP, str], int],
        cancellation: Cancellation,
    ) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.table = table
        self.outbox = outbox
        self.notifier = notifier
        self.policies = policies
        #: the agents whose saga has a step flagged for approval
        self.saga_flagged = saga_flagged
        #: how many tasks of an agent await a decision on a partition (the scanner's index)
        self.awaiting_in = awaiting_in
        #: a ``cancel`` decision's transitions (ledger/cancel_decisions.py)
        self.cancellation = cancellation

    def policy_of(self, record: TaskRecord) -> ApprovalPolicy | None:
        """The approval policy a task's parked call waits under: its agent's, else — a routed agent's task, whose
        handler's tool asked (execution/handlers.py) — the policy of the handler its journal names now."""
        policy = self.policies.get(record.agent)
        if policy is not None or not record.steps_done or '"kind":"route"' not in record.steps_done:
            return policy
        handler = route_journal.read(leases.completed_steps(record)).handler
        return self.policies.get(handler) if handler is not None else None

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
        self, tp: TP, offset: int, key: bytes | None, value: bytes | None, headers: Any, at: float | None = None,
    ) -> tuple[str, Transition] | None:
        """A decision on ``agent.approvals``: (task_id, its transition), or None when it changes nothing here.
        ``at`` is the decision record's Kafka timestamp (a cancel's result is stamped with it)."""
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
        if decision.decision == "cancel":
            cancelled = self.cancellation.on_decision(tp, decision, record, self.signed(decision), at)
            return None if cancelled is None else (decision.task_id, cancelled)
        if record is None:
            # Every app id reads the decisions; the one that has the task applies it.
            log.debug("Decision for %s is not for a task of this app; ignored", decision.task_id)
            return None
        signed = self.signed(decision)
        problem = self._refusal(decision, record, signed)
        if problem is not None:
            log.info(
                "Decision %s by %r (via %s) for %s ignored: %s",
                decision.decision, decision.by, decision.via, decision.task_id, problem,
            )
            details = {"decision": decision.decision, "by": decision.by, "via": decision.via, "signed": signed,
                       "state": record.state, "reason": problem}
            self.outbox.control("approval.ignored", decision.task_id, record.agent, details)
            return None
        if not signed:
            log.warning(
                "Decision %s by %r (via %s) for %s carries no valid signature; applied and recorded as signed: false "
                "(set AGENTS_STREAM_APPROVAL_SECRET where decisions are made to sign them, and "
                "AGENTS_STREAM_APPROVAL_REQUIRE_SIGNED=1 to refuse unsigned ones)",
                decision.decision, decision.by, decision.via, decision.task_id,
            )
        new, effects = approvals.decide(
            record, decision=decision.decision, by=decision.by, via=decision.via, comment=decision.comment,
            now=time.time(), me=self.worker_id, ttl=self.settings.lease_ttl_s,
            rejected_result=self._rejected_json(decision.task_id, record, decision.by), signed=signed,
        )
        return decision.task_id, (record, new, effects)

    def signed(self, decision: ApprovalDecision) -> bool:
        """Whether the decision carries a valid signature made with this app's approval secret."""
        return decision_signed(
            self.settings.approval_secret, decision.sig, task_id=decision.task_id, decision=decision.decision,
            by=decision.by, via=decision.via, comment=decision.comment, level=decision.level, parked=decision.parked,
            agent=decision.agent, app_id=decision.app_id,
        )

    def _refusal(self, decision: ApprovalDecision, record: TaskRecord, signed: bool) -> str | None:
        """Why this decision does not decide the task, or None when it does."""
        if record.state != AWAITING_APPROVAL:
            return f"the task is {record.state} (decided before, or timed out)"
        if not signed and self.settings.approval_require_signed:
            return "the decision is not signed and AGENTS_STREAM_APPROVAL_REQUIRE_SIGNED is set"
        return approvals.binding_problem(
            record, here=self.settings.app_id, app_id=decision.app_id, agent=decision.agent, parked=decision.parked,
            level=decision.level,
        )

    def admit(self, tp: TP, old: TaskRecord | None, new: TaskRecord | None, effects: list[leases.Effect]) -> Transition:
        """A task about to be parked when its agent's share of the partition already waits: dead-lettered instead
        (approval_backlog_full) — the cap keeps the timers table, the index and /approvals bounded."""
        share = self.settings.approval_share()
        newly_parked = new is not None and new.state == AWAITING_APPROVAL and (
            old is None or old.state != AWAITING_APPROVAL
        )
        if not share or not newly_parked or new is None:
            return old, new, effects
        waiting = self.awaiting_in(tp, new.agent)
        if waiting < share:
            return old, new, effects
        task_id = json.loads(new.payload).get("task_id", "")
        log.warning(
            "Task %s of agent %s not parked: %d tasks already await approval on %s[%d] (at most %d per partition); "
            "dead-lettered as approval_backlog_full. Decide waiting ones, or raise AGENTS_STREAM_APPROVAL_MAX_AWAITING",
            task_id, new.agent, waiting, tp.topic, tp.partition, share,
        )
        failed = self._failed_json(task_id, new, f"approval_backlog_full: {waiting} tasks already await approval")
        ended, refused = approvals.overflow(
            new, agent=new.agent, partition=tp.partition, waiting=waiting, share=share, now=time.time(),
            failed_result=failed,
        )
        kept = [e for e in effects if not isinstance(e, leases.Notify)
                and not (isinstance(e, leases.Control) and e.event == "approval.requested")]
        return old, ended, [*kept, *refused]

    def park_call(self, tp: TP, task_id: str, record: TaskRecord | None, event: CallParked) -> Transition | None:
        """An agent loop's tool call waits for a human: the task parks at that call, within the agent's cap."""
        if record is None:
            return None
        policy = self.policy_of(record)
        if policy is None:  # the plan refuses such an agent at start; a config changed under a running task
            log.error(
                "Task %s: tool %s needs approval but agent %s has no approval levels; give it [agents.%s.approval] "
                "levels (the task is re-dispatched when its lease lapses)", task_id, event.tool, record.agent,
                record.agent,
            )
            return None
        call = {"turn": event.turn, "id": event.call_id, "tool": event.tool}
        new, effects = approvals.park_call(
            record, dispatch=event.dispatch, call=call, reason=event.reason, now=time.time(),
            timeouts=[level.timeout_s for level in policy.levels],
        )
        return self.admit(tp, record, new, effects)

    def on_timeout(self, task_id: str, record: TaskRecord | None, level: int) -> Transition | None:
        """A level's time ran out (an ``approval_timeout`` event): escalate, or reject after the last level."""
        if record is None:
            return None
        policy = self.policy_of(record)
        new, effects = approvals.escalate(
            record, level=level, timeouts=[lv.timeout_s for lv in policy.levels] if policy else [], now=time.time(),
            rejected_result=self._rejected_json(task_id, record, "timeout"), me=self.worker_id,
            ttl=self.settings.lease_ttl_s,
        )
        return record, new, effects

    def _rejected_json(self, task_id: str, record: TaskRecord, by: str) -> str:
        error = f"rejected by {by}" if by != "timeout" else "rejected: no approval before the last level's timeout"
        return self._failed_json(task_id, record, error)

    def _failed_json(self, task_id: str, record: TaskRecord, error: str) -> str:
        payload = json.loads(record.payload)
        return TaskResult(
            task_id=task_id, agent_name=record.agent, status="failed", output=None, confidence="failed",
            source="approval", attempts=0, job_id=payload.get("job_id"), error=error, completed_at=utcnow_iso(),
        ).to_json()

    def notify(self, task_id: str, record: TaskRecord, level: int) -> None:
        """Tell the level's webhook (best effort: a lost notification still times out and escalates)."""
        policy = self.policy_of(record)
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
            parked = approvals.parked_ms_of(record)  # a requeued task parked again gets new links
            app_id = self.settings.app_id
            links = {
                d: link(base, secret, task_id, d, level, rung.name, int(due), parked, app_id, record.agent)
                for d in ("approve", "reject")
            }
        instruction = json.loads(record.payload).get("instruction", "")
        body = slack_message(
            task_id=task_id, agent=record.agent, reason=state.get("reason", ""), level=level, level_name=rung.name,
            due=due, instruction=instruction, links=links,
        )
        self.notifier.notify(url, body, subject=f"task {task_id} level {level + 1}")

    def describe(self, task_id: str, record: TaskRecord) -> dict[str, Any]:
        """One waiting approval, as /approvals lists it."""
        state = approvals.state(record)
        policy = self.policy_of(record)
        level = state.get("level", 0)
        payload = json.loads(record.payload)
        return {
            # app_id, agent and parked: what a decision on this parking names (tables/approvals.binding_problem)
            "task_id": task_id, "app_id": self.settings.app_id, "agent": record.agent,
            "parked": approvals.parked_ms_of(record), "call": state.get("call"),
            "reason": state.get("reason"), "level": level + 1,
            "level_name": policy.levels[level].name if policy and level < len(policy.levels) else None,
            "requested_at": state.get("requested_at"), "due": state.get("due"),
            "escalations": state.get("escalations", []),
            "instruction": payload.get("instruction", ""), "context_data": payload.get("context_data", {}),
        }
