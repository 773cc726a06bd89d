"""The ledger: the one agent that owns the task table (validate → route → dedupe → lease → dispatch; apply outcomes)."""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import Any, Callable

from faust.types import TP

from agents_stream.config import ApprovalPolicy
from agents_stream.contract import topics
from agents_stream.contract.conversation_messages import conversation_of, is_message, message_from
from agents_stream.contract.errors import Fenced, PoisonMessage
from agents_stream.contract.events import (
    OUTCOMES,
    ApprovalTimeout,
    CacheReply,
    CallParked,
    CallsDelegated,
    DeadLettered,
    DeadLetterRequest,
    Heartbeat,
    JournalEntry,
    LeaseExpired,
    OutcomeEvent,
    RecordsExpired,
    StepDone,
    SubtaskResult,
    TaskFailed,
    TaskSucceeded,
    read_event,
)
from agents_stream.contract.models import TaskPayload, decode_record, task_from
from agents_stream.kafka.outbox import Outbox, Send
from agents_stream.kafka.watermark import Watermark
from agents_stream.ledger import identity, sizes, spans
from agents_stream.ledger.app_agents import AppAgents
from agents_stream.ledger.cache import AnswerCache
from agents_stream.ledger.cancel_decisions import Cancellation
from agents_stream.ledger.conversation_rounds import Conversations
from agents_stream.ledger.effects import AppliedHere, Effects, Tracing
from agents_stream.ledger.expiry_sweep import Expiry
from agents_stream.ledger.gate import ApprovalGate
from agents_stream.ledger.handoff_waits import HandoffWaits
from agents_stream.ledger.intake import moved, requeue_headers
from agents_stream.ledger.poison import Poison, dead_letter_unreadable
from agents_stream.ledger.records import record_of, result_json
from agents_stream.ledger.runs import Runs
from agents_stream.ledger.scanner import OpenTask, Scanner
from agents_stream.ledger.spend import add_spend, spend_report
from agents_stream.ledger.sub_tasks import Delegation
from agents_stream.ops import tracing
from agents_stream.ops.notify import Notifier
from agents_stream.ops.recent import RecentTasks
from agents_stream.orchestrator import Orchestrator
from agents_stream.settings import Settings
from agents_stream.tables import leases
from agents_stream.tables.definitions import Tables, writing
from agents_stream.tables.leases import TaskRecord

log = logging.getLogger(__name__)


class Ledger:
    """Applies task messages, decisions, outcome and cache events to the tables; their only writer.

    One event at a time, never awaiting I/O inline: every send goes through the outbox, which holds the event's
    offset until the broker confirmed it, so a slow broker never blocks the stream loop.
    """

    def __init__(
        self, settings: Settings, executor: Runs, worker_id: str, *, tables: Tables, watermark: Watermark,
        outbox: Outbox, notifier: Notifier, agents: AppAgents = AppAgents(), orchestrator: Orchestrator | None = None,
    ) -> None:
        self.settings = settings
        self.executor = executor
        self.worker_id = worker_id
        self.watermark = watermark
        self.outbox = outbox
        self.table = tables.tasks
        self.timers = tables.timers
        self.outcomes = topics.outcomes_topic(settings.app_id)
        self.answers_topic = topics.answers_topic(settings.app_id)
        self.scanner = Scanner(settings, executor, tables.tasks, tables.timers)
        self.cancellation = Cancellation(settings, outbox, set(agents.names), set(agents.sagas))  # each part: a copy
        self.gate = ApprovalGate(
            settings, worker_id, tables.tasks, outbox, notifier, policies=dict(agents.policies),
            saga_flagged=set(agents.saga_flagged), awaiting_in=self.scanner.awaiting_in, cancellation=self.cancellation,
        )
        self.cache = AnswerCache(
            tables.answers, outbox, answers_topic=self.answers_topic, outcomes_topic=self.outcomes,
            worker_id=worker_id, agents=set(agents.cached),
        )
        self.poison = Poison(tables.tasks, outbox, self.outcomes, worker_id)
        self.expiry = Expiry(settings, tables.tasks, outbox)
        self.delegation = Delegation(settings, worker_id, outbox)
        self.recent = RecentTasks(settings.console_recent)  # the console's recent list: the tasks changed last here
        self.orchestrator = orchestrator  # the job orchestrator when this app runs it; it shares this loop
        #: carries out each transition (its writes, sends and follow-ups) and holds each running task's offsets
        self.effects = Effects(
            tables, executor, watermark, outbox, gate=self.gate, delegation=self.delegation,
            cancellation=self.cancellation, scanner=self.scanner, recent=self.recent,
        )
        self.conversations = Conversations(  # messages arrive on the task topics; each round is a task here
            tables.conversations, tables.tasks, outbox, self.poison, agents=dict(agents.configs),
            partitions=settings.partitions, record_max_bytes=settings.record_max_bytes, start=self.start_round,
            interrupt=lambda task_id: self.executor.interrupt(task_id),
            waits=HandoffWaits.of(settings, tables, outbox, notifier, dict(agents.configs)),
        )
        self.effects.round_changed = self.conversations.round_changed
        #: (partition, first skipped offset) of records that never reached the ledger: read again from there; True: news
        self.on_gap: Callable[[TP, int], bool] = lambda tp, offset: True

    @property
    def policies(self) -> dict[str, ApprovalPolicy]:
        """Approval policies by agent."""
        return self.gate.policies

    @property
    def open_tasks(self) -> dict[str, OpenTask]:
        """The non-terminal tasks on this worker's partitions (the leases held)."""
        return self.scanner.open_tasks

    # -- the stream loop -------------------------------------------------------

    def handle(self, event: Any) -> None:
        """Apply one event. Never raises: an exception leaving the stream loop would ack it."""
        message = event.message
        tp = message.tp
        gap = self.watermark.gap(tp, message.offset)
        if gap is not None:
            # Not applied now: it comes again, in order, once the partition is read from the gap
            # (docs/decisions.md, "Each partition is applied in order").
            if self.on_gap(tp, gap):
                log.warning(
                    "Offsets %d..%d of %s[%d] never reached the ledger (dropped by the consumer); nothing is committed "
                    "past %d and the partition is read again from there",
                    gap, message.offset - 1, tp.topic, tp.partition, gap,
                )
                self.outbox.control("alert.offsets_skipped", f"{tp.topic}:{tp.partition}:{gap}", None,
                                    {"first": gap, "next_seen": message.offset})
            return
        expected = self.watermark.next_offset(tp)
        if expected is not None and message.offset < expected:
            # Handled already since the partition was assigned: a re-read of a gap can deliver records that the
            # fetch before it delivered too. Applying one again would send a finished task's result twice.
            return
        try:
            self._route(tp, message, event.key, event.value)
        except Exception as exc:
            self._failed(tp, message.offset, event.key, event.value, exc)
        finally:
            self.watermark.handled(tp, message.offset)

    def _failed(self, tp: TP, offset: int, key: bytes | None, value: bytes | None, exc: Exception) -> None:
        """A record the ledger could not apply. A task's offset is held (a bug must not lose a task: a restart
        reads it again); a record of an internal topic carries no work of its own, and holding it would stall
        its partition's commit for good, so it is skipped (a decision or job request is dead-lettered)."""
        where = f"{tp.topic}:{tp.partition}:{offset}"
        if topics.agent_of(tp.topic) is not None:
            log.exception("Ledger failed on %s[%d]@%d; the offset is held (not committed) and an alert was sent: %r",
                          tp.topic, tp.partition, offset, exc)
            self.watermark.open(tp, offset)
            self.outbox.control("alert.ledger_error", where, None, {"error": repr(exc)})
            return
        log.exception(
            "Ledger failed on %s[%d]@%d, a record of an internal topic; it is skipped (its offset is not held) and an "
            "alert was sent: %r. Report it with this log", tp.topic, tp.partition, offset, exc,
        )
        self.outbox.control("alert.internal_record_skipped", where, None, {"error": repr(exc)[:500]})
        if tp.topic in (topics.APPROVALS, topics.JOBS):
            unprocessable = PoisonMessage("unprocessable", repr(exc)[:500])
            what = "approval decision" if tp.topic == topics.APPROVALS else "job request"
            dead_letter_unreadable(self.outbox, tp, offset, key, value, unprocessable, what=what,
                                   topic=topics.dlq_of(tp.topic))

    def _route(self, tp: TP, message: Any, key: bytes | None, value: bytes | None) -> None:
        if message.topic == self.outcomes:
            self._on_outcome(tp, message.offset, key, value, message.timestamp)
        elif message.topic == self.answers_topic:
            self.cache.on_event(tp, message.offset, key, value)
        elif message.topic == topics.APPROVALS:
            decided = self.gate.on_decision(tp, message.offset, key, value, message.headers, message.timestamp)
            if decided is not None:
                task_id, (record, new, effects) = decided
                self.effects.apply(tp, message.offset, task_id, record, new, effects)
        elif self.orchestrator is not None and message.topic in self.orchestrator.topics:
            self.orchestrator.handle(tp, message.offset, key, value, message.headers)
        else:
            self._on_task(tp, message.offset, key, value, message.headers)

    # -- task messages ---------------------------------------------------------------

    def _on_task(self, tp: TP, offset: int, key: bytes | None, value: bytes | None, headers: Any) -> None:
        agent = topics.agent_of(tp.topic) or ""
        try:
            text, data = decode_record(value, self.settings.payload_max_bytes)
            if is_message(data):  # a conversation's message, keyed by its conversation
                self.conversations.on_record(tp, offset, message_from(text, data, agent=agent), value, headers)
                return
            task = task_from(text, agent=agent, max_steps=self.settings.max_steps)
        except PoisonMessage as poison:
            if tracing.on():
                spans.poisoned(agent, tp, offset, headers, poison)
            self.poison.on_message(tp, offset, agent, key, value, headers, poison)
            return
        if moved(self.outbox, self.settings.partitions, tp, offset, task.task_id, value, headers):
            return
        self._apply_task(tp, offset, task, value, headers)  # type: ignore[arg-type]  # decode_record refuses null

    def start_round(self, tp: TP, offset: int, task: TaskPayload) -> None:
        """A conversation's round (ledger/conversation_rounds.py): its task made as if it had arrived at ``offset``."""
        self._apply_task(tp, offset, task, task.model_dump_json(exclude_none=True).encode("utf-8"), made=True)

    def _apply_task(
        self, tp: TP, offset: int, task: TaskPayload, value: bytes, headers: Any = None, made: bool = False,
    ) -> None:
        now = time.time()
        record = record_of(self.table, task.task_id)
        digest = identity.task_digest(task)
        # A round's history is rebuilt from its conversation each time it is made: never a conflict with itself.
        if not made and identity.refuse_conflict(
            self.poison, self.outbox, tp, offset, task, digest, record, value, headers,
        ):
            return
        answered = self.cancellation.on_arrival(tp, offset, task.task_id, record, value, digest)
        if answered is not None:  # cancelled before it arrived: answered, never run
            self.effects.apply(tp, offset, task.task_id, *answered)
            return
        requeue_id, history = requeue_headers(headers)
        span = spans.intake(task, tp, offset, headers, record) if tracing.on() else None
        if record is not None and record.state == leases.RUNNING and record.owner != self.worker_id:
            log.info(
                "Task %s arrived again (offset %d) while %s holds its lease for %.1fs more; waiting for its outcome "
                "or the lease to lapse", task.task_id, offset, record.owner, record.lease_until - now,
            )
        message = leases.TaskMessage(
            agent=task.agent_name, payload=value.decode("utf-8"), topic=tp.topic, partition=tp.partition,
            offset=offset, requeue_id=requeue_id, history=history, digest=digest,
            trace=span.traceparent if span is not None else None,
        )
        new, effects = leases.receive(
            record,
            message,
            now=now,
            me=self.worker_id,
            ttl=self.settings.lease_ttl_s,
            max_attempts=self.settings.max_attempts,
            running_here=self.scanner.running_here(task.task_id, record.dispatch if record is not None else None),
            approval=self.gate.approval_for(task),
        )
        _, new, effects = self.gate.admit(tp, record, new, effects)  # the agent's share of parked tasks is bounded
        self.effects.apply(tp, offset, task.task_id, record, new, effects, task=task, traced_by=Tracing(span))

    # -- outcome events ----------------------------------------------------------------

    def _on_outcome(self, tp: TP, offset: int, key: bytes | None, value: bytes | None, at: float | None) -> None:
        """An outcome event; ``at`` is its record's Kafka timestamp (seconds), the completed_at of its result."""
        parsed = read_event(tp, offset, key, value, OUTCOMES)  # logs and skips malformed and unknown kinds
        if parsed is None:
            return
        task_id, event = parsed
        match event:
            case DeadLetterRequest():  # this worker asked to dead-letter a poison message
                self.poison.on_request(tp, offset, task_id)
                return
            case DeadLettered():  # a poison message's dead letter is confirmed: remember it
                self.poison.on_marked(tp, offset, task_id)
                return
            case CacheReply(answer=answer):
                self.executor.cache_answer(task_id, answer)
                return
            case RecordsExpired(keys=keys):  # the expiry sweep's finds: tombstoned by this, the table's writer
                tombstones = self.expiry.apply(tp, keys, time.time())
                if tombstones:
                    self.outbox.deliver(tp, offset, tombstones)
                return
        record = record_of(self.table, task_id)
        if isinstance(event, ApprovalTimeout | CallParked):  # a human decides: the gate's transitions
            timed_out = (self.gate.on_timeout(task_id, record, event.level) if isinstance(event, ApprovalTimeout)
                         else self.gate.park_call(tp, task_id, record, event))
            if timed_out is not None:
                self.effects.apply(tp, offset, task_id, *timed_out)
            return
        if isinstance(event, CallsDelegated | SubtaskResult):  # agents as tools: sub-tasks out, results in
            trace = event.trace if isinstance(event, CallsDelegated) else None  # the delegating run's span
            delegated = self.delegation.on_event(task_id, record, event)
            self.effects.apply(tp, offset, task_id, *delegated, traced_by=Tracing(parent=trace))
            return
        changed = self._lease_change(tp, task_id, record, event, at)
        if changed is not None:
            new, effects, extra = changed
            if isinstance(event, LeaseExpired) and event.interrupted:  # a round stopped for new messages: they join
                new = self.conversations.join(tp, offset, task_id, record, new)
            self.effects.apply(tp, offset, task_id, record, new, effects, extra=extra)
        elif record is not None and record.terminal and conversation_of(task_id) is not None:
            self.conversations.round_ended(tp, offset, task_id, record)  # its end again: the reply may not be durable

    def apply_here(
        self, task_id: str, event: TaskSucceeded | TaskFailed | StepDone | JournalEntry,
    ) -> asyncio.Future[None] | None:
        """An outcome of this worker's own executor, applied at once (no trip through the outcomes topic), when
        this ledger holds the task's offset: its partition is this worker's and its table is live here. None
        otherwise: the outcome goes on the outcomes topic to whoever owns the partition now.

        The future settles once the transition's writes and sends are durable; a result (or dead letter) is sent
        once the finished record is durable. It runs between two events, on the loop's one thread, so the ledger
        stays the tables' one writer (docs/decisions.md, "Outcomes applied where they ran")."""
        held = self.effects.task_offsets.get(task_id)
        if not held:
            return None
        tp, offset, _ = held[0]
        durable: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with writing(tp.partition):
            record = record_of(self.table, task_id)
            changed = self._lease_change(tp, task_id, record, event, time.time())
            if changed is None:
                durable.set_result(None)  # nothing to apply (a task already finished, a stale journal entry)
                return durable
            new, effects, extra = changed
            self.effects.apply(
                tp, offset, task_id, record, new, effects, extra=extra, here=AppliedHere(
                    durable=partial(_resolve, durable), fenced=partial(_fence, durable, task_id),
                ),
            )
        return durable

    def _lease_change(
        self, tp: TP, task_id: str, record: TaskRecord | None, event: OutcomeEvent, at: float | None,
    ) -> tuple[TaskRecord | None, list[leases.Effect], list[Send]] | None:
        """The lease transition of an outcome event (and the sends of a finished task's spend and cache)."""
        now = time.time()
        ttl = self.settings.lease_ttl_s
        extra: list[Send] = []
        match event:
            case Heartbeat(dispatch=dispatch, owner=owner):
                # From when it was sent: a beat a new owner reads late (its sender dead) adds no lease time.
                sent = min(now, at) if at is not None else now
                new, effects = leases.heartbeat(record, dispatch=dispatch, owner=owner, now=sent, ttl=ttl)
                # Renewals are frequent: write only when the lease gained a third of its length.
                if new is record or new is None or record is None or new.lease_until - record.lease_until < ttl / 3:
                    return None
            case TaskSucceeded() | TaskFailed():
                stored = leases.ended_by(record, dispatch=event.dispatch, status=event.kind)
                if stored is not None:  # read again: its first reader lost the partition before the result went out
                    return record, [leases.EmitResult(stored)], []
                if record is None or record.terminal:
                    return None  # the first outcome won; a later one (a re-dispatch racing) changes nothing
                if event.dispatch != record.dispatch:
                    log.info(
                        "Task %s: an outcome of dispatch %d from %s is dropped: dispatch %d holds the lease now (the "
                        "earlier run was taken over)", task_id, event.dispatch, event.worker, record.dispatch,
                    )
                    return None
                new, effects, event = self._finish(task_id, record, event, now, at)
                extra = self._account(tp, record, event, now)
            case StepDone(index=index, output=output, dispatch=dispatch) | JournalEntry(
                index=index, output=output, dispatch=dispatch,
            ):  # both are kept in steps_done (contract/checkpoints.py)
                new, effects = leases.checkpoint(record, index=index, output=output, dispatch=dispatch)
                failed = sizes.oversize(new, event, self.settings.record_max_bytes) if new is not record else None
                if failed is not None and record is not None:  # a checkpoint past Kafka's record limit ends it
                    new, effects, _ = self._finish(task_id, record, failed, now, at)
            case LeaseExpired(dispatch=dispatch, released=released):
                gone = bool(released) or (record is not None and self.scanner.gone(record.owner))
                new, effects = leases.expire(
                    record, dispatch=dispatch, now=now, me=self.worker_id, ttl=ttl,
                    max_attempts=self.settings.max_attempts, running_here=self.scanner.running_here(task_id, dispatch),
                    owner_gone=gone,
                )
            case _:  # the kinds _on_outcome handles itself
                return None
        return new, effects, extra

    def _finish(
        self, task_id: str, record: TaskRecord, event: TaskSucceeded | TaskFailed, now: float, at: float | None,
    ) -> tuple[TaskRecord | None, list[leases.Effect], TaskSucceeded | TaskFailed]:
        """The terminal transition of ``event``, or of its result_too_large failure when the record would not fit
        in a Kafka record (the event applied is returned: it is what spend and the cache account)."""
        reason = event.reason if isinstance(event, TaskFailed) else None
        result = result_json(task_id, record, event, at)
        new, effects = leases.finish(
            record, status=event.kind, result=result, reason=reason, now=now, dispatch=event.dispatch,
        )
        failed = sizes.oversize(new, event, self.settings.record_max_bytes)
        if failed is None:
            return new, effects, event
        log.warning("Task %s fails: %s (dead-lettered; the answer is not kept)", task_id, failed.error)
        return self._finish(task_id, record, failed, now, at)  # a failure's record is its payload and a short result

    def _account(self, tp: TP, record: TaskRecord, event: TaskSucceeded | TaskFailed, now: float) -> list[Send]:
        """A finished task adds its cost to its partition's spend of the day, and a good answer feeds the cache;
        the sends returned are held with the outcome's offset."""
        sends: list[Send] = []
        cost = event.usage.cost
        if cost:
            sends += add_spend(self.table, self.outbox, tp, record.agent, cost, now)
        stored = self.cache.store(record, event, now)
        if stored is not None:
            sends.append(stored)
        return sends

    def spend_report(self, partitions: set[int], agents: list[str], now: float) -> dict[str, Any]:
        """{agent: {day: {partition: usd}}} for this worker's partitions, for the circuits' presence events."""
        return spend_report(self.table, partitions, agents, now)

    # -- the scanner, approvals and rebalances ------------------------------------------------

    def scan(self, now: float) -> list[tuple[str, int]]:
        """Tasks whose lease lapsed and that no local slot runs, as (task_id, dispatch): to re-dispatch."""
        return self.scanner.scan(now)

    def scan_gone(self, now: float) -> list[tuple[str, int]]:
        """Tasks whose lease's owner left the group, as (task_id, dispatch): to take over now."""
        return self.scanner.scan_gone(now)

    def scan_parked(self, now: float) -> list[tuple[str, int]]:
        """Approvals whose level timed out, as (task_id, level)."""
        return self.scanner.scan_parked(now)

    def approvals_pending(self, agents: list[str]) -> dict[str, int]:
        """How many tasks of each agent await a decision on this worker's partitions (from memory: no table read)."""
        return self.scanner.approvals_pending(agents)

    def awaiting(self) -> list[dict[str, Any]]:
        """The approvals waiting on this worker's partitions, oldest first (for /approvals)."""
        waiting = [self.gate.describe(task_id, record) for task_id, record in self.scanner.parked()]
        return sorted(waiting, key=lambda w: w["requested_at"] or 0.0)

    def forget(self, tps: set[TP]) -> None:
        """Partitions revoked: their open tasks and held offsets now belong to the next owner."""
        self.poison.forget(tps)
        self.watermark.forget(tps)
        self.scanner.forget(tps)
        self.effects.forget(tps)
        self.recent.forget({tp.partition for tp in tps})
        if self.orchestrator is not None:
            self.orchestrator.recent.forget({tp.partition for tp in tps})


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _fence(fut: asyncio.Future[None], task_id: str) -> None:
    if not fut.done():
        fut.set_exception(Fenced(f"task {task_id}: its partition moved before the outcome applied here was durable"))
