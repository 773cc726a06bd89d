"""The ledger's index of open tasks on this worker's partitions, and the scans that turn lapsed time into events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from faust.types import TP

from agents_stream.execution.executor import Executor
from agents_stream.ledger.records import record_of
from agents_stream.settings import Settings
from agents_stream.tables import approvals
from agents_stream.tables.definitions import LedgerTable
from agents_stream.tables.leases import AWAITING_APPROVAL, TaskRecord


@dataclass
class OpenTask:
    """The scanner's view of a non-terminal task in a partition this worker owns."""

    tp: TP
    dispatch: int
    lease_until: float
    requested: float = 0.0  # when the scanner last asked for a re-dispatch


class Scanner:
    """Open tasks and parked ones (from memory, kept by ``note``), and the lease and approval-timeout scans."""

    def __init__(self, settings: Settings, executor: Executor, tasks: LedgerTable, timers: LedgerTable) -> None:
        self.settings = settings
        self.executor = executor
        self.tasks = tasks
        #: tasks parked for a decision or running after one: their offsets are committed, so the
        #: scanner finds them here (a small table) rather than through a redelivery
        self.timers = timers
        self.open_tasks: dict[str, OpenTask] = {}
        #: tasks awaiting a decision on this worker's partitions: task_id → (partition, agent), for the metrics;
        #: kept by ``note`` and made whole again by every scan_parked (after a restart or a rebalance)
        self.awaiting_approval: dict[str, tuple[TP, str]] = {}
        self._timer_asked: dict[str, float] = {}

    def note(self, task_id: str, record: TaskRecord) -> None:
        """The task's record as the ledger just wrote (or read) it."""
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
        for task_id, record in self._timed():
            if record.terminal:
                continue
            if record.state != AWAITING_APPROVAL:
                if task_id not in self.open_tasks:
                    self.note(task_id, record)  # a restart or rebalance: lease recovery takes it from here
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

    def parked(self) -> Iterator[tuple[str, TaskRecord]]:
        """The tasks awaiting a decision on this worker's partitions, read from the tables."""
        for task_id, record in self._timed():
            if record.state == AWAITING_APPROVAL:
                yield task_id, record

    def _timed(self) -> Iterator[tuple[str, TaskRecord]]:
        """The tasks of the timers table that have a record."""
        for key in list(self.timers.keys()):
            if not key.startswith("task/"):
                continue
            task_id = key[len("task/"):]
            record = record_of(self.tasks, task_id)
            if record is not None:
                yield task_id, record

    def forget(self, tps: set[TP]) -> None:
        """Partitions revoked: their open and parked tasks are the next owner's."""
        self.open_tasks = {t: info for t, info in self.open_tasks.items() if info.tp not in tps}
        self.awaiting_approval = {t: held for t, held in self.awaiting_approval.items() if held[0] not in tps}
