"""The ledger: the one agent that owns the task table (validate → route → dedupe → lease → dispatch; apply outcomes).

It handles one event at a time and never awaits I/O inline: every send it
starts (dead letter, re-route, result, control event, the table's own
changelog record) is delivered by a supervised background task that retries
until the broker confirms it, and the event's offset stays open in the
watermark until then. So the committed offset never passes a task whose
outcome is not durable, and a slow broker never blocks the stream loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from faust.types import TP

from agents_stream.config import ApprovalPolicy
from agents_stream.contract import topics
from agents_stream.contract.errors import PoisonMessage
from agents_stream.contract.models import (
    ApprovalDecision,
    ControlEvent,
    TaskPayload,
    TaskResult,
    Usage,
    internal_event,
    parse_json_model,
    parse_task,
    utcnow_iso,
)
from agents_stream.execution import pricing
from agents_stream.execution.executor import Executor
from agents_stream.execution.outputs import fingerprint
from agents_stream.kafka import security as kafka_security
from agents_stream.kafka.delivery import CONFIRM_TIMEOUT_S, Send, confirmed
from agents_stream.kafka.watermark import Watermark
from agents_stream.ops import dlq as dlq_tools
from agents_stream.ops import metrics
from agents_stream.ops.notify import Notifier, link, slack_message
from agents_stream.orchestrator import fan_in_event
from agents_stream.settings import Settings
from agents_stream.tables import approvals, leases
from agents_stream.tables.leases import AWAITING_APPROVAL, TaskRecord

log = logging.getLogger(__name__)

@dataclass
class OpenTask:
    """The scanner's view of a non-terminal task in a partition this worker owns."""

    tp: TP
    dispatch: int
    lease_until: float
    requested: float = 0.0  # when the scanner last asked for a re-dispatch


@dataclass(eq=False)
class _Poison:
    """A poison message this worker dead-letters: asked for on the outcomes topic, then sent (once)."""

    dead_letter: Callable[[float | None], None]  # given when an earlier owner may have sent it (see _dlq_send)
    done: asyncio.Future  # done once the dead letter is confirmed (or it is no longer this worker's to send)
    sending: bool = False


@dataclass(eq=False)
class _Delivery:
    """The sends one event started, on their way to the broker; its offset is held until all are confirmed."""

    tp: TP
    offset: int
    gen: int  # the watermark generation of its hold
    sends: list[Send]
    started: list[Any]
    after: list[Callable[[], None]]
    left: int = 0
    timer: asyncio.TimerHandle | None = None
    settled: bool = False


class Ledger:
    def __init__(self, app: Any, settings: Settings, executor: Executor, worker_id: str) -> None:
        self.app = app
        self.settings = settings
        self.executor = executor
        self.worker_id = worker_id
        self.watermark: Watermark = app.watermark
        self.table = app.task_table
        self.answers = app.answers_table
        self.outcomes = topics.outcomes_topic(settings.app_id)
        self.answers_topic = topics.answers_topic(settings.app_id)
        #: agents whose good answers feed the last-good-answer cache
        self.cached_agents: set[str] = set()
        #: tasks parked for a decision or running after one: their offsets are committed, so the
        #: scanner finds them here (a small table) rather than through a redelivery
        self.timers = app.timers_table
        #: approval policies by agent, and the agents whose saga has a step flagged for approval
        self.policies: dict[str, ApprovalPolicy] = {}
        self.saga_flagged: set[str] = set()
        self.notifier = Notifier()
        #: the job orchestrator (agents_stream.orchestrator) when this app runs it; it shares this loop
        self.orchestrator: Any = None
        #: the offsets held for each running task, with the watermark generation of each hold
        self.task_offsets: dict[str, list[tuple[TP, int, int]]] = {}
        self.open_tasks: dict[str, OpenTask] = {}
        #: called with (partition, first skipped offset) when records never reached the ledger; the runtime
        #: reads the partition again from there. True when this is news (worth a log line and an alert).
        self.on_gap: Callable[[TP, int], bool] = lambda tp, offset: True
        #: tasks awaiting a decision on this worker's partitions: task_id → (partition, agent), for the metrics;
        #: kept by _index and made whole again by every scan_parked (after a restart or a rebalance)
        self.awaiting_approval: dict[str, tuple[TP, str]] = {}
        #: poison messages this worker is dead-lettering, until their marker is written (see _on_poison)
        self._poison: dict[tuple[TP, int], _Poison] = {}
        self._pending: set[_Delivery] = set()  # deliveries waiting on the broker (callbacks, no task)
        self._deliveries: set[asyncio.Task] = set()  # deliveries being retried
        self._timer_asked: dict[str, float] = {}
        self._topics: dict[str, Any] = {}

    # -- the stream loop -------------------------------------------------------

    def handle(self, event: Any) -> None:
        """Apply one event. Never raises: an exception leaving the stream loop would ack it."""
        message = event.message
        tp = message.tp
        gap = self.watermark.gap(tp, message.offset)
        if gap is not None:
            # Records before this one never reached the ledger (dropped by the consumer). This one is not applied
            # now: it comes again, in order, once the partition is read from the gap (an outcome partition's
            # order is what lets a dead owner's events be read before what this worker asks for since).
            if self.on_gap(tp, gap):
                log.warning(
                    "Offsets %d..%d of %s[%d] never reached the ledger (dropped by the consumer); nothing is committed "
                    "past %d and the partition is read again from there",
                    gap, message.offset - 1, tp.topic, tp.partition, gap,
                )
                self.control("alert.offsets_skipped", f"{tp.topic}:{tp.partition}:{gap}", None, {"first": gap, "next_seen": message.offset})
            return
        try:
            if message.topic == self.outcomes:
                self._on_outcome(tp, message.offset, event.key, event.value)
            elif message.topic == self.answers_topic:
                self._on_answers(tp, message.offset, event.key, event.value)
            elif message.topic == topics.APPROVALS:
                self._on_decision(tp, message.offset, event.key, event.value, message.headers)
            elif self.orchestrator is not None and message.topic in self.orchestrator.topics:
                self.orchestrator.handle(tp, message.offset, event.key, event.value)
            else:
                self._on_task(tp, message.offset, event.key, event.value, message.headers)
        except Exception as exc:  # a bug must not lose the message: hold its offset, alert, carry on
            log.exception(
                "Ledger failed on %s[%d]@%d; the offset is held (not committed) and an alert was sent: %r",
                tp.topic, tp.partition, message.offset, exc,
            )
            self.watermark.open(tp, message.offset)
            self.control("alert.ledger_error", f"{tp.topic}:{tp.partition}:{message.offset}", None, {"error": repr(exc)})
        finally:
            self.watermark.handled(tp, message.offset)

    # -- task messages ---------------------------------------------------------------

    def _on_task(self, tp: TP, offset: int, key: bytes | None, value: bytes | None, headers: Any) -> None:
        agent = topics.agent_of(tp.topic) or ""
        try:
            task = parse_task(value, agent=agent, max_bytes=self.settings.payload_max_bytes)
        except PoisonMessage as poison:
            self._on_poison(tp, offset, agent, key, value, headers, poison)
            return
        if self.moved(tp, offset, task.task_id, value, headers):
            return
        self._apply_task(tp, offset, task, value, headers)

    def _on_poison(self, tp: TP, offset: int, agent: str, key: bytes | None, value: bytes | None, headers: Any, poison: PoisonMessage) -> None:
        """Layer 1: a message no agent can use gets one dead letter, also when it is delivered again.

        A marker in the task table (written once the dead letter is confirmed) answers a redelivery. It is
        asked for through this app's outcomes topic, on the message's partition, rather than at once: a worker
        that died between its dead letter and the marker's write left its ``dead_lettered`` event there, so the
        new owner reads that first and finds the marker when its own request comes up. A worker that gets the
        partition back while its dead letter is still on its way waits for that one.
        """
        marker = poison_key(tp.topic, offset)
        if self._marker(marker) == DONE:
            log.info("%s[%d]@%d was dead-lettered before; not again", tp.topic, tp.partition, offset)
            return
        pending = self._poison.get((tp, offset))
        if pending is not None:
            log.info("%s[%d]@%d is being dead-lettered already; not again", tp.topic, tp.partition, offset)
            self._deliver(tp, offset, [lambda f=pending.done: f])
            return
        done = asyncio.get_running_loop().create_future()
        reason = poison.reason + (f": {poison.detail}" if poison.detail else "")
        _, history = requeue_headers(headers)
        extra = [(HISTORY_HEADER, history.encode("utf-8"))] if history else []

        def dead_letter(sent_since: float | None) -> None:
            log.warning(
                "Dead-lettering %s[%d]@%d: %s (layer 1; see %s)", tp.topic, tp.partition, offset, poison, topics.dlq_topic(agent),
            )
            self._dead_letter(
                tp, offset, agent, key, value, reason, "schema", 1, extra, sent_since=sent_since,
                then=[lambda: self._retrying(self._mark(tp, marker, done))],
            )

        self._poison[(tp, offset)] = _Poison(dead_letter, done)
        # The offset is held until the dead letter is confirmed (``done``), whoever's request acts.
        request = lambda: self._send(self.outcomes, marker.encode(), DEAD_LETTER_REQUEST, partition=tp.partition)  # noqa: E731
        self._deliver(tp, offset, [request, lambda: done])

    async def _mark(self, tp: TP, marker: str, done: asyncio.Future) -> None:
        """A poison message's dead letter is confirmed: send its ``dead_lettered`` event (the ledger writes the
        marker when it reads it) until the broker has it; only then is its offset released (``done``)."""
        try:
            await confirmed(
                lambda: self._send(self.outcomes, marker.encode(), MARK_EVENT, partition=tp.partition),
                what=f"the dead_lettered event of {tp.topic}:{tp.partition}",
                alert=lambda exc: self.control("alert.broker_send_failing", marker.lstrip("\x00"), None, {"error": repr(exc)}),
            )
        finally:
            if not done.done():
                done.set_result(None)

    def _release_poison(self, source: tuple[TP, int] | None) -> None:
        """This worker no longer dead-letters ``source`` (its marker is written, or it is another worker's now):
        forget it and release the offset hold that waits for it."""
        pending = self._poison.pop(source, None)  # type: ignore[arg-type]
        if pending is not None and not pending.done.done():
            pending.done.set_result(None)

    def _retrying(self, coro: Any) -> "asyncio.Task[Any]":
        """Run ``coro`` as a delivery task (cancelled at stop, counted by ``delivering``)."""
        task = asyncio.ensure_future(coro)
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)
        return task

    def _on_dead_letter_request(self, tp: TP, offset: int, marker: str) -> None:
        """This worker's request to dead-letter a poison message came back (see _on_poison).

        The marker first says the dead letter is being sent (``sending``), and the dead letter goes once that
        is in the changelog. A worker that then died before its ``dead_lettered`` event leaves that state to the
        next owner, whose dead letter looks on the topic before it is sent (``_dlq_send``).
        """
        source = _poison_source(marker, tp.partition)
        pending = self._poison.get(source) if source else None
        if pending is None or pending.sending:
            return  # asked by a worker that died before acting (its message came here and asks again), or a repeat
        state = self._marker(marker)
        if state == DONE:
            log.info("%s[%d]@%d was dead-lettered by another worker before; not again", source[0].topic, tp.partition, source[1])
            self._release_poison(source)
            return
        pending.sending = True
        if state is not None:  # begun by an owner that stopped before it was marked: it may be on the topic
            pending.dead_letter(float(state))
            return
        self.table[marker] = json.dumps({"sending": time.time(), "by": self.worker_id})
        self._deliver(tp, offset, [self._changelog_send(tp.partition, marker, self.table.last_changelog)], [lambda: pending.dead_letter(None)])

    async def find_dead_letter(self, dlq: str, source: tuple[str, int, int], since: float) -> Any:
        """The dead letter on ``dlq`` of the message at ``source`` (topic, partition, offset), written after
        ``since``; None when there is none. (A unit test replaces it.)"""
        return await dlq_tools.find_dead_letter(
            self.settings.broker, dlq, source, since - DEAD_LETTER_CLOCK_SLACK_S, timeout=30.0,
            security=kafka_security.client_kwargs(self.settings),
        )

    def _marker(self, marker: str) -> str | float | None:
        """A poison message's marker: None, DONE, or when an owner began its dead letter (``sending``)."""
        data = self.table.get(marker)
        if not data:
            return None
        sending = json.loads(data).get("sending")
        return DONE if sending is None else float(sending)

    def _apply_task(self, tp: TP, offset: int, task: TaskPayload, value: bytes, headers: Any = None) -> None:
        now = time.time()
        record = self._get(task.task_id)
        requeue_id, history = requeue_headers(headers)
        if record is not None and record.state == leases.RUNNING and record.owner != self.worker_id:
            log.info(
                "Task %s arrived again (offset %d) while %s holds its lease for %.1fs more; waiting for its outcome "
                "or the lease to lapse", task.task_id, offset, record.owner, record.lease_until - now,
            )
        new, effects = leases.receive(
            record,
            agent=task.agent_name,
            payload=value.decode("utf-8"),
            topic=tp.topic,
            partition=tp.partition,
            offset=offset,
            now=now,
            me=self.worker_id,
            ttl=self.settings.lease_ttl_s,
            max_attempts=self.settings.max_attempts,
            running_here=self.executor.has(task.task_id),
            requeue_id=requeue_id,
            history=history,
            approval=self._approval_for(task),
        )
        self._apply(tp, offset, task.task_id, record, new, effects, task=task)

    # -- human approval ------------------------------------------------------------------

    def _approval_for(self, task: TaskPayload) -> tuple[str, list[float]] | None:
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

    def _on_decision(self, tp: TP, offset: int, key: bytes | None, value: bytes | None, headers: Any) -> None:
        try:
            decision: ApprovalDecision = parse_json_model(value, ApprovalDecision, self.settings.payload_max_bytes)
        except PoisonMessage as poison:
            log.warning("Dead-lettering approval decision %s[%d]@%d: %s", tp.topic, tp.partition, offset, poison)
            reason = poison.reason + (f": {poison.detail}" if poison.detail else "")
            self._dead_letter(tp, offset, "", key, value, reason, "schema", 1, topic=topics.dlq_of(topics.APPROVALS))
            return
        if self.moved(tp, offset, decision.task_id, value, headers):
            return
        record = self._get(decision.task_id)
        if record is None:
            # Every app id reads the decisions; the one that has the task applies it.
            log.debug("Decision for %s is not for a task of this app; ignored", decision.task_id)
            return
        if record.state != AWAITING_APPROVAL:
            log.info(
                "Decision %s by %s for %s ignored: the task is %s (decided before, or timed out)",
                decision.decision, decision.by, decision.task_id, record.state,
            )
            self.control("approval.ignored", decision.task_id, record.agent, {"decision": decision.decision, "by": decision.by, "state": record.state})
            return
        now = time.time()
        new, effects = approvals.decide(
            record, decision=decision.decision, by=decision.by, via=decision.via, comment=decision.comment,
            now=now, me=self.worker_id, ttl=self.settings.lease_ttl_s,
            rejected_result=self._rejected_json(decision.task_id, record, decision.by),
        )
        self._apply(tp, offset, decision.task_id, record, new, effects)

    def _on_approval_timeout(self, tp: TP, offset: int, task_id: str, record: TaskRecord | None, level: Any) -> None:
        if record is None or not isinstance(level, int):
            return
        policy = self.policies.get(record.agent)
        new, effects = approvals.escalate(
            record, level=level, timeouts=[lv.timeout_s for lv in policy.levels] if policy else [], now=time.time(),
            rejected_result=self._rejected_json(task_id, record, "timeout"),
        )
        self._apply(tp, offset, task_id, record, new, effects)

    def _rejected_json(self, task_id: str, record: TaskRecord, by: str) -> str:
        payload = json.loads(record.payload)
        return TaskResult(
            task_id=task_id, agent_name=record.agent, status="failed", output=None, confidence="failed",
            source="approval", attempts=0, job_id=payload.get("job_id"),
            error=f"rejected by {by}" if by != "timeout" else "rejected: no approval before the last level's timeout",
            completed_at=utcnow_iso(),
        ).model_dump_json()

    def _notify(self, task_id: str, record: TaskRecord, level: int) -> None:
        """Tell the level's webhook (best effort: a lost notification still times out and escalates)."""
        policy = self.policies.get(record.agent)
        if policy is None or level >= len(policy.levels):
            return
        rung = policy.levels[level]
        url = rung.webhook_url()
        if not url:
            log.info("Task %s awaits approval at level %d (%s), which has no webhook configured", task_id, level + 1, rung.name)
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

    # -- outcome events ----------------------------------------------------------------

    def _on_outcome(self, tp: TP, offset: int, key: bytes | None, value: bytes | None) -> None:
        parsed = internal_event(tp, offset, key, value, "outcome")
        if parsed is None:
            return
        task_id, event, kind = parsed
        if kind == "dead_letter":  # this worker asked to dead-letter a poison message (see _on_poison)
            self._on_dead_letter_request(tp, offset, task_id)
            return
        if kind == "dead_lettered":  # a poison message's dead letter is confirmed: remember it (see _on_poison)
            self._release_poison(_poison_source(task_id, tp.partition))  # its dead letter is confirmed (ours or another's)
            self.table[task_id] = json.dumps({"at": time.time()})
            self._deliver(tp, offset, [self._changelog_send(tp.partition, task_id, self.table.last_changelog)])
            return
        dispatch = event.get("dispatch")
        record = self._get(task_id)
        now = time.time()
        ttl = self.settings.lease_ttl_s
        extra: list[Send] = []
        if kind == "heartbeat":
            new, effects = leases.heartbeat(record, dispatch=dispatch, owner=event.get("owner", ""), now=now, ttl=ttl)
            # Renewals are frequent: write only when the lease gained a third of its length.
            if new is record or new.lease_until - record.lease_until < ttl / 3:
                return
        elif kind in ("succeeded", "failed"):
            if record is None or record.terminal:
                return  # the first outcome won; a later one (a re-dispatch racing) changes nothing
            result = self._result_json(task_id, record, event)
            new, effects = leases.finish(record, status=kind, result=result, reason=event.get("reason"), now=now)
            extra = self._account(tp, record, event, now)
        elif kind == "step":
            index = event.get("index")
            if not isinstance(index, int):
                log.warning("Skipping step event without an index for %s", task_id)
                return
            new, effects = leases.checkpoint(record, index=index, output=event.get("output"))
        elif kind == "approval_timeout":
            self._on_approval_timeout(tp, offset, task_id, record, event.get("level"))
            return
        elif kind == "cache_reply":
            self.executor.cache_answer(task_id, event.get("answer"))
            return
        elif kind == "expired":
            new, effects = leases.expire(
                record,
                dispatch=dispatch,
                now=now,
                me=self.worker_id,
                ttl=ttl,
                max_attempts=self.settings.max_attempts,
                running_here=self.executor.has(task_id),
            )
        else:
            log.warning("Skipping outcome event of unknown kind %r for %s (a newer worker's?)", kind, task_id)
            return
        self._apply(tp, offset, task_id, record, new, effects, extra=extra)

    def _result_json(self, task_id: str, record: TaskRecord, event: dict[str, Any]) -> str:
        payload = json.loads(record.payload)
        failed = event["kind"] == "failed"
        result = TaskResult(
            task_id=task_id,
            agent_name=record.agent,
            status="failed" if failed else event.get("status", "succeeded"),
            output=event.get("output"),
            confidence="failed" if failed else event.get("confidence", "high"),
            source=event.get("source", ""),
            partial=bool(event.get("partial", False)),
            attempts=record.dispatch,
            usage=Usage(**event.get("usage", {})),
            job_id=payload.get("job_id"),
            error=event.get("error"),
            completed_at=utcnow_iso(),
        )
        return result.model_dump_json()

    # -- spend and the last-good-answer cache -----------------------------------------------

    def _account(self, tp: TP, record: TaskRecord, event: dict[str, Any], now: float) -> list[Send]:
        """A finished task adds its cost to its partition's spend of the day, and a good answer feeds the cache;
        the sends returned are held with the outcome's offset."""
        sends: list[Send] = []
        cost = (event.get("usage") or {}).get("cost")
        if cost:
            key = spend_key(record.agent, pricing.day_key(now), tp.partition)
            before = self.table.get(key)
            usd = (json.loads(before)["usd"] if before else 0.0) + float(cost)
            self.table[key] = json.dumps({"usd": round(usd, 9)})
            sends.append(self._changelog_send(tp.partition, key, self.table.last_changelog))
        if (
            record.agent in self.cached_agents
            and event["kind"] == "succeeded"
            and event.get("status", "succeeded") == "succeeded"
            and event.get("confidence") in ("high", "medium")
        ):
            payload = json.loads(record.payload)
            fp = fingerprint(record.agent, payload.get("instruction", ""), payload.get("context_data") or {}, payload.get("output_schema"))
            body = json.dumps({
                "schema_version": 1, "kind": "store", "task_id": payload.get("task_id"), "output": event.get("output"),
                "source": event.get("source", ""), "confidence": event.get("confidence"), "at": now,
            }).encode()
            sends.append(lambda b=body, k=fp.encode(): self._send(self.answers_topic, k, b))
        return sends

    def spend_report(self, partitions: set[int], agents: list[str], now: float) -> dict[str, Any]:
        """{agent: {day: {partition: usd}}} for this worker's partitions, for the circuits' presence events."""
        day = pricing.day_key(now)
        report: dict[str, Any] = {}
        for agent in agents:
            parts = {}
            for p in partitions:
                data = self.table.get(spend_key(agent, day, p))
                if data:
                    parts[str(p)] = json.loads(data)["usd"]
            if parts:
                report[agent] = {day: parts}
        return report

    def _on_answers(self, tp: TP, offset: int, key: bytes | None, value: bytes | None) -> None:
        """The cache's partition of a fingerprint: store good answers, answer lookups (best effort)."""
        parsed = internal_event(tp, offset, key, value, "cache")
        if parsed is None:
            return
        fp, event, kind = parsed
        if kind == "store":
            self.answers[fp] = json.dumps({k: event.get(k) for k in ("task_id", "output", "source", "confidence", "at")})
            self._deliver(tp, offset, [self._changelog_send(tp.partition, fp, self.answers.last_changelog, self.answers)])
        elif kind == "lookup" and isinstance(event.get("task_id"), str):
            data = self.answers.get(fp)
            reply = json.dumps({
                "schema_version": 1, "kind": "cache_reply", "dispatch": event.get("dispatch"), "worker": self.worker_id,
                "answer": json.loads(data) if data else None,
            }).encode()
            self._send(self.outcomes, event["task_id"].encode(), reply)
        else:
            log.warning("Skipping cache event of unknown kind %r at %s[%d]@%d", kind, tp.topic, tp.partition, offset)

    # -- applying a transition --------------------------------------------------------------

    def _apply(
        self,
        tp: TP,
        offset: int,
        task_id: str,
        old: TaskRecord | None,
        new: TaskRecord | None,
        effects: list[leases.Effect],
        task: TaskPayload | None = None,
        extra: list[Send] | None = None,
    ) -> None:
        sends: list[Send] = list(extra or [])
        after: list[Callable[[], None]] = []
        if new is not None and new != old:
            self.table[task_id] = new.to_json()
            sends.append(self._changelog_send(tp.partition, task_id, self.table.last_changelog))
            timer = timer_key(task_id)
            if _parked(new) and not _parked(old):
                self.timers[timer] = {"kind": "task"}
                sends.append(self._changelog_send(tp.partition, timer, self.timers.last_changelog, self.timers))
            elif _parked(old) and not _parked(new):
                del self.timers[timer]
                sends.append(self._changelog_send(tp.partition, timer, self.timers.last_changelog, self.timers))
        record = new or old
        if record is not None:
            self._index(task_id, record)
        outcome = leases.ended(old, new)
        if outcome is not None:
            after.append(lambda a=record.agent, o=outcome: metrics.tasks.labels(a, o).inc())
        for effect in effects:
            if isinstance(effect, leases.Track):
                self.task_offsets.setdefault(task_id, []).append((tp, offset, self.watermark.open(tp, offset)))
            elif isinstance(effect, leases.Dispatch):
                payload = task or TaskPayload.model_validate_json(record.payload)
                dispatch = effect.dispatch
                # Dispatch once the lease record is durable, so a crash cannot
                # leave a provider call without a record of it.
                done = leases.completed_steps(record)
                after.append(lambda p=payload, d=dispatch, s=done: self.executor.dispatch(p, d, s))
            elif isinstance(effect, leases.EmitResult):
                result = effect.result.encode("utf-8")
                sends.append(lambda r=result: self._send(topics.RESULTS, task_id.encode(), r))
                job_id = _job_of(record)
                if job_id is not None:  # fan-in: the job's owner hears of every result of its tasks
                    fan = fan_in_event(effect.result)
                    sends.append(lambda j=job_id, f=fan: self._send(topics.JOB_EVENTS, j.encode(), f))
            elif isinstance(effect, leases.DeadLetter):
                source_tp = TP(record.topic, record.partition)
                extra = [("agents_stream.requeues", str(record.requeues).encode())] if record.requeues else []
                if record.history:
                    extra.append((HISTORY_HEADER, record.history.encode("utf-8")))
                sends.append(self._dlq_send(
                    record.agent, task_id.encode(), record.payload.encode("utf-8"),
                    effect.reason, effect.layer, effect.attempts, source_tp, record.offset, extra,
                ))
                after.append(lambda a=record.agent, lay=effect.layer: metrics.dead_letters.labels(a, lay).inc())
                job_id = _job_of(record)
                if job_id is not None and record.result is None:  # no result will come: the job counts it failed
                    failed = json.dumps({"task_id": task_id, "status": "failed", "error": f"dead-lettered: {effect.reason}"})
                    sends.append(lambda j=job_id, f=fan_in_event(failed): self._send(topics.JOB_EVENTS, j.encode(), f))
            elif isinstance(effect, leases.Control):
                if effect.event == "task.redispatched":
                    log.info(
                        "Task %s: the lease of %s lapsed; dispatching it here as attempt %d",
                        task_id, effect.details.get("previous_owner"), effect.details.get("dispatch"),
                    )
                self.control(effect.event, task_id, record.agent if record else None, effect.details)
            elif isinstance(effect, leases.Notify):
                after.append(lambda r=record, lv=effect.level: self._notify(task_id, r, lv))
            elif isinstance(effect, leases.Settle):
                for held_tp, held_offset, gen in self.task_offsets.pop(task_id, []):
                    after.append(lambda t=held_tp, o=held_offset, g=gen: self.watermark.close(t, o, g))
        if sends or after:
            self._deliver(tp, offset, sends, after)

    def moved(self, tp: TP, offset: int, key: str, value: bytes | None, headers: Any) -> bool:
        """A record that is not on its key's partition (keyless, or another partitioner such as librdkafka's)
        is sent there first, because the tables keep that key on that partition; True when it was moved."""
        raw = key.encode("utf-8")
        home = topics.partition_for(raw, self.settings.partitions)
        if home == tp.partition:
            return False
        reroute = list(headers or []) + [("agents_stream.rerouted_from", f"{tp.topic}:{tp.partition}:{offset}".encode())]
        self._deliver(tp, offset, [lambda: self._send(tp.topic, raw, value, partition=home, headers=reroute)])
        return True

    def _index(self, task_id: str, record: TaskRecord) -> None:
        if record.state == AWAITING_APPROVAL:
            self.awaiting_approval[task_id] = (TP(record.topic, record.partition), record.agent)
        else:
            self.awaiting_approval.pop(task_id, None)
        if record.terminal or record.state == AWAITING_APPROVAL:
            self.open_tasks.pop(task_id, None)
        else:
            self.open_tasks[task_id] = OpenTask(TP(record.topic, record.partition), record.dispatch, record.lease_until)

    def approvals_pending(self, agents: list[str]) -> dict[str, int]:
        """How many tasks of each agent await a decision on this worker's partitions (from memory: no table read)."""
        counts = dict.fromkeys(agents, 0)
        for _, agent in self.awaiting_approval.values():
            counts[agent] = counts.get(agent, 0) + 1
        return counts

    # -- dead letters and control events -------------------------------------------------------

    def _dead_letter(
        self, tp: TP, offset: int, agent: str, key: bytes | None, value: bytes | None, reason: str, layer: str,
        attempts: int, extra: list[tuple[str, bytes]] | None = None, topic: str | None = None,
        then: list[Callable[[], None]] | None = None, sent_since: float | None = None,
    ) -> None:
        sends = [self._dlq_send(agent, key, value, reason, layer, attempts, tp, offset, extra, topic, sent_since)]
        self.control("task.dead_lettered", (key or b"").decode("utf-8", "replace") or f"{tp.topic}:{tp.partition}:{offset}", agent, {"reason": reason, "layer": layer})
        self._deliver(tp, offset, sends, [lambda: metrics.dead_letters.labels(agent or metrics.NO_AGENT, layer).inc(), *(then or [])])

    def _dlq_send(
        self, agent: str, key: bytes | None, value: bytes | None, reason: str, layer: str, attempts: int,
        source: TP, offset: int, extra: list[tuple[str, bytes]] | None = None, topic: str | None = None,
        sent_since: float | None = None,
    ) -> Send:
        """The send of one dead letter. Its retries (and its first attempt too when ``sent_since`` says an earlier
        owner may have sent it since then) look on the topic first and send only if it is not there."""
        headers = [
            ("error_reason", reason.encode("utf-8")),
            ("error_layer", layer.encode()),
            ("original_topic", source.topic.encode()),
            ("original_partition", str(source.partition).encode()),
            ("original_offset", str(offset).encode()),
            ("failed_at", utcnow_iso().encode()),
            ("attempts", str(attempts).encode()),
            *(extra or []),
        ]
        target = topic or topics.dlq_topic(agent)
        where = (source.topic, source.partition, offset)
        since = time.time() if sent_since is None else sent_since
        tried: list[asyncio.Future] = []  # every attempt so far
        sent: list[asyncio.Future] = []  # the records among them actually sent

        def put() -> "asyncio.Future[Any]":
            fut = self._send(target, key, value, headers=headers)
            sent.append(fut)
            return fut

        def send() -> "asyncio.Future[Any]":
            fut = put() if not tried and sent_since is None else self._retrying(self._unless_there(list(tried), sent, target, where, since, put))
            tried.append(fut)
            return fut

        return send

    async def _unless_there(
        self, tried: list[asyncio.Future], sent: list[asyncio.Future], dlq: str, source: tuple[str, int, int], since: float,
        put: Send,
    ) -> Any:
        """One attempt of a dead letter that may be on the topic already: wait for the attempts before (an
        unanswered send may still land), look for it (``find_dead_letter``), and send it only if it is not there."""
        waiting = [f for f in (*tried, *sent) if not f.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=CONFIRM_TIMEOUT_S)
        landed = next((f for f in sent if _confirmed(f)), None)
        if landed is not None:
            return landed.result()
        found = await self.find_dead_letter(dlq, source, since)
        if found is not None:
            log.info("The dead letter of %s[%d]@%d is on %s already (%s); not sent again", *source, dlq, found.ref)
            return found
        fut = put()
        await asyncio.wait((fut,), timeout=CONFIRM_TIMEOUT_S)
        if not fut.done():
            raise TimeoutError(f"no answer from the broker within {CONFIRM_TIMEOUT_S:.0f}s")
        return fut.result()

    def control(self, event: str, subject: str, agent: str | None, details: dict[str, Any]) -> None:
        """Publish a control event (best effort: losing one loses no work, so it holds no offset)."""
        record = ControlEvent(event=event, subject=subject, agent_name=agent, worker=self.worker_id, details=details)
        fut = self._send(topics.CONTROL, subject.encode("utf-8"), record.model_dump_json().encode())
        fut.add_done_callback(_log_control_failure)

    # -- sends and their durability --------------------------------------------------------------

    def _get(self, task_id: str) -> TaskRecord | None:
        data = self.table.get(task_id)
        return TaskRecord.from_json(data) if data else None

    def _send(self, topic: str, key: bytes | None, value: bytes | None, *, partition: int | None = None, headers: Any = None) -> "asyncio.Future[Any]":
        channel = self._topics.get(topic)
        if channel is None:
            channel = self._topics[topic] = self.app.topic(topic, key_serializer="raw", value_serializer="raw")
        return channel.send_soon(key=key, value=value, partition=partition, headers=headers)

    def _changelog_send(self, partition: int, key: str, first: Any, table: Any = None) -> Send:
        """The table's own changelog send first; on a retry, re-send the key's current value
        (idempotent in a compacted changelog)."""
        pending = [first]
        table = self.table if table is None else table

        def send() -> Any:
            if pending:
                return pending.pop()
            return table.send_changelog(partition, key, table.get(key))

        return send

    def _deliver(self, tp: TP, offset: int, sends: list[Send], after: list[Callable[[], None]] | None = None) -> None:
        """Hold ``offset`` open until every send is confirmed, then run ``after``.

        The common case costs no task: a callback on each send's future counts them down (two deliveries per
        task, so this is on the hot path). A send that failed, or had no answer within CONFIRM_TIMEOUT_S,
        hands the delivery to a task that retries it (``_confirm``).
        """
        gen = self.watermark.open(tp, offset)
        delivery = _Delivery(tp, offset, gen, sends, [send() for send in sends], after or [])
        waiting = [f for f in delivery.started if not f.done()]
        if not waiting:
            self._settle(delivery)
            return
        delivery.left = len(waiting)
        delivery.timer = asyncio.get_running_loop().call_later(CONFIRM_TIMEOUT_S, self._settle, delivery)
        self._pending.add(delivery)
        for fut in waiting:
            fut.add_done_callback(lambda _, d=delivery: self._answered(d))

    def _answered(self, delivery: _Delivery) -> None:
        delivery.left -= 1
        if delivery.left == 0:
            self._settle(delivery)

    def _settle(self, delivery: _Delivery) -> None:
        """Every send of ``delivery`` answered (or the timeout came): release its offset, or retry in a task."""
        if delivery.settled:
            return
        delivery.settled = True
        self._pending.discard(delivery)
        if delivery.timer is not None:
            delivery.timer.cancel()
        tp, offset = delivery.tp, delivery.offset
        if all(_confirmed(f) for f in delivery.started):
            try:
                for fn in delivery.after:
                    fn()
            except Exception as exc:  # a bug in a follow-up must not hold the offset forever
                log.exception("A follow-up of %s[%d]@%d failed after its sends were confirmed: %r", tp.topic, tp.partition, offset, exc)
            finally:
                self.watermark.close(tp, offset, delivery.gen)
            return
        self._retrying(self._confirm(delivery))

    async def _confirm(self, delivery: _Delivery) -> None:
        """Retry ``delivery`` until the broker confirms every send: a failed send from its error, one with no
        answer yet sent again now; then run its follow-ups and release its offset."""
        tp, offset = delivery.tp, delivery.offset
        where = f"{tp.topic}:{tp.partition}:{offset}"
        try:
            for send, fut in zip(delivery.sends, delivery.started, strict=True):
                await confirmed(
                    send,
                    what=f"the effects of {where}",
                    alert=lambda exc: self.control("alert.broker_send_failing", where, None, {"error": repr(exc)}),
                    first=fut if fut.done() else None,  # not done by now: it had no answer in time
                )
            for fn in delivery.after:
                fn()
        finally:
            self.watermark.close(tp, offset, delivery.gen)

    def delivering(self) -> int:
        """Deliveries not yet confirmed by the broker (their offsets are held open)."""
        return len(self._pending) + len(self._deliveries)

    async def stop(self) -> None:
        """Drop deliveries still pending: their offsets were never committed, so nothing is lost."""
        for delivery in list(self._pending):  # their offsets stay held: nothing after them is committed
            delivery.settled = True
            if delivery.timer is not None:
                delivery.timer.cancel()
        self._pending.clear()
        for task in list(self._deliveries):
            task.cancel()
        if self._deliveries:
            await asyncio.wait(list(self._deliveries), timeout=5.0)
        await self.notifier.stop()

    # -- lease scanner and rebalances ---------------------------------------------------------

    def scan(self, now: float) -> list[tuple[str, int]]:
        """Tasks whose lease lapsed and that no local slot runs: ask the ledger (via an event) to re-dispatch."""
        due = []
        for task_id, info in self.open_tasks.items():
            if now < info.lease_until or self.executor.has(task_id):
                continue
            if now - info.requested < max(1.0, self.settings.lease_ttl_s / 4):
                continue
            info.requested = now
            due.append((task_id, info.dispatch))
        return due

    def scan_parked(self, now: float) -> list[tuple[str, int]]:
        """Tasks with a decision pending or made (their offsets are committed, so no redelivery finds them):
        approvals whose level timed out, as (task_id, level); running ones join the lease scan."""
        due = []
        throttle = max(1.0, self.settings.lease_ttl_s / 4)
        asked, self._timer_asked = self._timer_asked, {}
        waiting: dict[str, tuple[TP, str]] = {}
        for key in list(self.timers.keys()):
            if not key.startswith("task/"):
                continue
            task_id = key[len("task/"):]
            record = self._get(task_id)
            if record is None or record.terminal:
                continue
            if record.state != AWAITING_APPROVAL:
                if task_id not in self.open_tasks:
                    self._index(task_id, record)  # a restart or rebalance: lease recovery takes it from here
                continue
            waiting[task_id] = (TP(record.topic, record.partition), record.agent)
            level = approvals.due(record, now)
            if level is None:
                continue
            if now - asked.get(task_id, 0.0) >= throttle:
                asked[task_id] = now
                due.append((task_id, level))
            self._timer_asked[task_id] = asked[task_id]  # kept only while the timeout is still unanswered
        self.awaiting_approval = waiting  # the timers table is the truth: it has the parked tasks no redelivery brings
        return due

    def awaiting(self) -> list[dict[str, Any]]:
        """The approvals waiting on this worker's partitions, oldest first (for /approvals)."""
        waiting = []
        for key in list(self.timers.keys()):
            if not key.startswith("task/"):
                continue
            record = self._get(key[len("task/"):])
            if record is None or record.state != AWAITING_APPROVAL:
                continue
            state = approvals.state(record)
            policy = self.policies.get(record.agent)
            level = state.get("level", 0)
            payload = json.loads(record.payload)
            waiting.append({
                "task_id": key[len("task/"):], "agent": record.agent, "reason": state.get("reason"), "level": level + 1,
                "level_name": policy.levels[level].name if policy and level < len(policy.levels) else None,
                "requested_at": state.get("requested_at"), "due": state.get("due"), "escalations": state.get("escalations", []),
                "instruction": payload.get("instruction", ""), "context_data": payload.get("context_data", {}),
            })
        return sorted(waiting, key=lambda w: w["requested_at"] or 0.0)

    def forget(self, tps: set[TP]) -> None:
        """Partitions revoked: their open tasks and held offsets now belong to the next owner."""
        for source, pending in list(self._poison.items()):
            if source[0] not in tps or (pending.sending and not pending.done.done()):
                continue  # a dead letter on its way is waited for if the partition comes back (see _on_poison)
            self._release_poison(source)  # not asked yet: the next owner asks (its hold here is gone with the partition)
        self.watermark.forget(tps)
        self.open_tasks = {t: info for t, info in self.open_tasks.items() if info.tp not in tps}
        self.awaiting_approval = {t: held for t, held in self.awaiting_approval.items() if held[0] not in tps}
        for task_id, offs in list(self.task_offsets.items()):
            kept = [held for held in offs if held[0] not in tps]
            if kept:
                self.task_offsets[task_id] = kept
            else:
                del self.task_offsets[task_id]


REQUEUE_HEADER, HISTORY_HEADER = topics.REQUEUE_HEADER, topics.HISTORY_HEADER


def requeue_headers(headers: Any) -> tuple[str | None, str | None]:
    """(requeue id, history JSON) from a task message's headers; (None, None) for an ordinary task."""
    requeue_id = history = None
    for name, value in headers or ():
        try:
            if name == REQUEUE_HEADER:
                requeue_id = value.decode("utf-8")
            elif name == HISTORY_HEADER:
                history = value.decode("utf-8")
        except (AttributeError, UnicodeDecodeError):
            continue  # a header we cannot read is not ours
    return requeue_id, history


def _job_of(record: TaskRecord | None) -> str | None:
    if record is None:
        return None
    job_id = json.loads(record.payload).get("job_id")
    return job_id if isinstance(job_id, str) and job_id else None


def timer_key(task_id: str) -> str:
    return f"task/{task_id}"


def _parked(record: TaskRecord | None) -> bool:
    """Waiting for a decision, or running after one: found by the scanner, not by a redelivery."""
    return record is not None and record.approval is not None and not record.terminal


DONE = "done"  # a marker's state once the dead letter is confirmed (see Ledger._marker)
#: how far before an earlier owner began a dead letter its record is looked for (clocks of workers and broker)
DEAD_LETTER_CLOCK_SLACK_S = 600.0
MARK_EVENT = json.dumps({"schema_version": 1, "kind": "dead_lettered"}).encode()
DEAD_LETTER_REQUEST = json.dumps({"schema_version": 1, "kind": "dead_letter"}).encode()


def _confirmed(fut: asyncio.Future) -> bool:
    """The send behind ``fut`` is done and the broker has it."""
    return fut.done() and not fut.cancelled() and fut.exception() is None


def _poison_source(marker: str, partition: int) -> tuple[TP, int] | None:
    """(partition, offset) of the poison message a marker key (see poison_key) names."""
    _, _, rest = marker.partition("/")
    topic, _, offset = rest.rpartition("/")
    return (TP(topic, partition), int(offset)) if topic and offset.isdigit() else None


def poison_key(topic: str, offset: int) -> str:
    """A poison message's marker in the task table (on its own partition: the changelog follows the source)."""
    return f"\x00dead/{topic}/{offset}"


def spend_key(agent: str, day: str, partition: int) -> str:
    """Spend lives in the task table under one key per agent, day and partition: each partition sums its own."""
    return f"\x00spend/{agent}/{day}/{partition}"


def _log_control_failure(fut: "asyncio.Future[Any]") -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.warning("A control event was not delivered: %r (no work is affected)", fut.exception())
