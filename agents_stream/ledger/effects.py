"""Carrying out a task's transition: its record and timer written, its effects' sends held with the offset, and what
runs once they are durable (a dispatch, a metric, the held offsets released)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Sequence

from faust.types import TP

from agents_stream.contract.conversation_messages import conversation_of
from agents_stream.contract.models import TaskPayload
from agents_stream.kafka.outbox import Outbox, Send
from agents_stream.kafka.watermark import Watermark
from agents_stream.ledger import endings, spans
from agents_stream.ledger.cancel_decisions import Cancellation, CancelTask, StopRun
from agents_stream.ledger.gate import ApprovalGate
from agents_stream.ledger.records import parked, timer_key
from agents_stream.ledger.runs import Runs
from agents_stream.ledger.scanner import Scanner
from agents_stream.ledger.sub_tasks import Delegation
from agents_stream.ops import metrics, tracing
from agents_stream.ops.recent import RecentTasks
from agents_stream.tables import leases
from agents_stream.tables.definitions import Tables
from agents_stream.tables.delegation import SendTask
from agents_stream.tables.leases import TaskRecord

__all__ = ["AppliedHere", "Effects", "Tracing"]


@dataclass(frozen=True)
class Tracing:
    """Where a transition's spans go (ledger/spans.py): ``span``, the intake's, takes its events; ``parent``: the
    traceparent its spans hang under, when not the record's."""

    span: tracing.Span | None = None
    parent: str | None = None


@dataclass(frozen=True)
class AppliedHere:
    """How the transition of an outcome applied where it ran (``Ledger.apply_here``) is carried out: ``durable`` is
    called once all of it is durable, or ``fenced`` instead when the partition moved before its writes were
    confirmed (Outbox.deliver): nothing of it is acted on here."""

    durable: Callable[[], object] | None = None
    fenced: Callable[[], object] | None = None

log = logging.getLogger(__name__)


@dataclass
class _EndSends:
    """The sends that say a task ended: its result (with its job's fan-in and its caller's copy), sent once the record
    is durable, and its dead letter (and, without a result, its failure to the job and the caller)."""

    results: list[Send] = field(default_factory=list)
    dead: list[Send] = field(default_factory=list)

Effect = leases.Effect | SendTask | CancelTask | StopRun


class Effects:
    """Applies a transition the ledger decided: writes the task table, holds the event's offset until every send
    is confirmed, then runs the follow-ups. Also the offsets held for each running task (``Track``,
    ``ReleaseOffsets``)."""

    def __init__(
        self, tables: Tables, executor: Runs, watermark: Watermark, outbox: Outbox, *, gate: ApprovalGate,
        delegation: Delegation, cancellation: Cancellation, scanner: Scanner, recent: RecentTasks,
    ) -> None:
        self.table = tables.tasks
        self.timers = tables.timers
        self.executor = executor
        self.watermark = watermark
        self.outbox = outbox
        self.gate = gate
        self.delegation = delegation
        self.cancellation = cancellation
        self.scanner = scanner
        self.recent = recent
        #: the offsets held for each running task, with the watermark generation of each hold
        self.task_offsets: dict[str, list[tuple[TP, int, int]]] = {}
        #: called with (tp, offset, task_id, old, new) after each transition of a conversation's round
        #: (ledger/conversation_rounds.py: its events; once it finished, its reply and the next round)
        self.round_changed: Callable[[TP, int, str, TaskRecord | None, TaskRecord | None], object] | None = None

    def apply(
        self,
        tp: TP,
        offset: int,
        task_id: str,
        old: TaskRecord | None,
        new: TaskRecord | None,
        effects: Sequence[Effect],
        task: TaskPayload | None = None,
        extra: list[Send] | None = None,
        traced_by: Tracing = Tracing(),
        here: AppliedHere = AppliedHere(),
    ) -> None:
        """Write ``new`` (when it differs from ``old``), carry out ``effects``; ``extra`` sends are held with the
        offset too. ``traced_by``: where its spans go; ``here``: an outcome applied where it ran (AppliedHere)."""
        span, trace = traced_by.span, traced_by.parent
        durable, fenced = here.durable, here.fenced
        sends: list[Send] = list(extra or [])
        end = _EndSends()
        after: list[Callable[[], object]] = []
        wrote = new is not None and new != old
        if wrote:
            sends += self._write(tp, task_id, old, new)  # type: ignore[arg-type]  # wrote: new is a record
        record = new or old
        if record is not None:
            self.scanner.note(task_id, record)
            try:  # the console's list: a bug there must not cut a transition in half (its record is staged)
                self.recent.task(task_id, record, task.job_id if task else None, time.time())
            except Exception as exc:
                log.exception("The console's recent list could not note task %s (%r); the task is unaffected",
                              task_id, exc)
        traced = None
        if span is not None or (record is not None and record.trace is not None and tracing.on()):
            parent = trace or (record.trace if record is not None else None)
            try:  # spans are a view of the transition: failing, they must not cut it in half (its record is staged)
                traced = spans.traced(task_id, old, new, effects, span, parent, self.executor.worker_id)
            except Exception as exc:
                log.exception("No spans for task %s's transition (%r); the task is unaffected", task_id, exc)
        outcome = leases.ended(old, new)
        if outcome is not None:
            ended = (record.agent, outcome)  # type: ignore[union-attr]  # a task that ended has a record
            after.append(lambda: metrics.tasks.labels(*ended).inc())
        for effect in effects:
            self._effect(tp, offset, task_id, record, effect, task, sends, end, after, traced)
        starts = [e.dispatch for e in effects if isinstance(e, leases.Dispatch)]
        if starts:  # a dispatch that waits for this record no longer waits if the partition moves first
            fenced = partial(self._not_started, task_id, starts[-1], fenced)
        if durable is not None:
            after.insert(0, durable)  # first: a follow-up that fails must not leave its waiter waiting
        if traced is not None:
            if sends or end.results or end.dead:  # the spans end once the transition is durable
                after.append(partial(traced.end, new))
            else:
                traced.end(new)
        if durable is not None:  # applied where it ran: no outcome record to apply again, so its dead letter waits too
            ending = end.results + end.dead
        else:  # its event is read again until the record and the dead letter are both durable
            ending = end.results
            sends += end.dead
        if ending and wrote:
            # A result says the task ended: it goes out only once the record that ends it is durable while the
            # partition is this worker's and the group confirms it a member (Outbox.deliver). Sent beside the
            # record, it could land while the record, written by a worker that lost the partition meanwhile, is
            # skipped by the next owner (owner epochs): the task would run again and answer twice. Two deliveries,
            # the offset held throughout: the second is opened before the first releases it. Fenced, the event
            # that ended the task is read again by the next owner, which finds the task finished and sends the
            # stored result (leases.ended_by, cancel.cancelled_by, leases.receive).
            after = [partial(self.outbox.deliver, tp, offset, ending, after, fence=True, fenced=fenced)]
        else:
            sends += ending
        if sends or after:
            self.outbox.deliver(tp, offset, sends, after, fence=True, fenced=fenced)
        if self.round_changed is not None and conversation_of(task_id):
            self.round_changed(tp, offset, task_id, old, new)

    def _dispatch(self, task_id: str, task: TaskPayload, dispatch: int, done: list[Any], trace: str | None) -> None:
        """Start dispatch ``dispatch`` now that its lease record is durable, unless the record moved on meanwhile
        (a cancel, or another transition, applied while this record waited for the broker): the record is what
        decides whether the task runs, not the order in which the broker confirmed two writes. The scanner holds
        every open task's dispatch as the ledger last wrote it (memory: no table read per dispatch)."""
        self.scanner.started(task_id, dispatch)
        current = self.scanner.open_tasks.get(task_id)
        if current is None or current.dispatch != dispatch:
            log.info("Task %s: dispatch %d is not started: its record moved on before the lease was durable (%s)",
                     task_id, dispatch, "no longer open here" if current is None else f"dispatch {current.dispatch}")
            return
        self.executor.dispatch(task, dispatch, done, trace)

    def _not_started(self, task_id: str, dispatch: int, then: Callable[[], object] | None) -> None:
        """The partition moved before the lease record of ``dispatch`` was durable: it never starts here."""
        self.scanner.started(task_id, dispatch)
        if then is not None:
            then()

    def _write(self, tp: TP, task_id: str, old: TaskRecord | None, new: TaskRecord) -> list[Send]:
        """Write the task's new record (and its timer, when it starts or stops being parked); their sends."""
        self.table[task_id] = new.to_json()
        sends = [self.outbox.changelog(self.table, tp.partition, task_id)]
        timer = timer_key(task_id)
        if parked(new) and not parked(old):
            self.timers[timer] = {"kind": "task"}
            sends.append(self.outbox.changelog(self.timers, tp.partition, timer))
        elif parked(old) and not parked(new):
            del self.timers[timer]
            sends.append(self.outbox.changelog(self.timers, tp.partition, timer))
        return sends

    def _effect(
        self, tp: TP, offset: int, task_id: str, record: Any, effect: Effect,
        task: TaskPayload | None, sends: list[Send], end: _EndSends, after: list[Callable[[], object]],
        traced: spans.Traced | None,
    ) -> None:
        """Carry out one effect of a transition: ``sends`` (and ``end``, its result's and dead letter's) are held with
        the offset, ``after`` runs once they are durable."""
        if traced is not None:
            traced.effect(effect)
        if isinstance(effect, leases.Track):
            self.task_offsets.setdefault(task_id, []).append((tp, offset, self.watermark.open(tp, offset)))
        elif isinstance(effect, leases.Dispatch):
            payload = task or TaskPayload.model_validate_json(record.payload)
            # Dispatch once the lease record is durable, so a crash cannot leave a provider call without a record.
            done = leases.completed_steps(record)
            trace = traced.dispatch(effect.dispatch) if traced is not None else None
            # its lease is this worker's while it waits
            self.scanner.start(task_id, TP(record.topic, record.partition), effect.dispatch)
            after.append(partial(self._dispatch, task_id, payload, effect.dispatch, done, trace))
        elif isinstance(effect, leases.EmitResult):
            end.results += endings.result_sends(self.outbox, self.delegation, task_id, record, effect.result)
        elif isinstance(effect, leases.DeadLetter):
            letters, counted = endings.dead_letter_sends(self.outbox, self.delegation, task_id, record, effect)
            end.dead += letters
            after.append(counted)
        elif isinstance(effect, leases.Control):
            if effect.event == "task.redispatched":
                left = effect.details.get("why") == "owner_left"
                what = "left the group or released it" if left else "let its lease lapse"
                log.info(
                    "Task %s: %s %s; dispatching it here as attempt %d", task_id,
                    effect.details.get("previous_owner"), what, effect.details.get("dispatch"),
                )
            self.outbox.control(effect.event, task_id, record.agent if record else None, effect.details)
        elif isinstance(effect, leases.Notify):
            after.append(partial(self.gate.notify, task_id, record, effect.level))
        elif isinstance(effect, SendTask):
            sends.append(self.delegation.send(effect, traced.invoke_agent(effect) if traced is not None else None))
        elif isinstance(effect, CancelTask):
            sends.append(self.cancellation.send(effect, task_id, record))
        elif isinstance(effect, StopRun):  # once the cancel is durable: a crash first leaves the run going
            after.append(partial(self.executor.cancel, task_id))
        elif isinstance(effect, leases.ReleaseOffsets):
            for held_tp, held_offset, gen in self.task_offsets.pop(task_id, []):
                after.append(partial(self.watermark.close, held_tp, held_offset, gen))

    def forget(self, tps: set[TP]) -> None:
        """Partitions revoked: the offsets held for their tasks now belong to the next owner."""
        for task_id, offs in list(self.task_offsets.items()):
            kept = [held for held in offs if held[0] not in tps]
            if kept:
                self.task_offsets[task_id] = kept
            else:
                del self.task_offsets[task_id]
