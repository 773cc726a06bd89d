"""The ledger's index of open and parked tasks on this worker's partitions, and the scans that turn lapsed time
into events (leases from memory; approval timeouts from a due-time index, not by rereading parked records)."""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass
from typing import Iterator

from faust.types import TP

from agents_stream.kafka.members import in_group, replaced_by
from agents_stream.ledger.records import record_of
from agents_stream.ledger.runs import Runs
from agents_stream.settings import Settings
from agents_stream.tables import approvals
from agents_stream.tables.definitions import KeyedTable
from agents_stream.tables.leases import AWAITING_APPROVAL, AWAITING_SUBTASKS, TaskRecord

log = logging.getLogger(__name__)


@dataclass
class OpenTask:
    """The scanner's view of a non-terminal task in a partition this worker owns."""

    tp: TP
    dispatch: int
    lease_until: float
    requested: float = 0.0  # when the scanner last asked for a re-dispatch
    owner: str = ""  # the worker that holds the lease


@dataclass(frozen=True)
class ParkedTask:
    """A task awaiting a decision: where it is, and when its current level's time runs out."""

    tp: TP
    agent: str
    level: int
    due: float


class DueIndex:
    """Parked tasks by task id, their count per (partition, agent), and a heap of (when to look, task, level, due).

    A heap entry is stale once the task moved on (decided, escalated: its level or due changed); stale entries
    are dropped as they come up, so a scan costs the entries that are due, not every parked task.
    """

    def __init__(self) -> None:
        self.parked: dict[str, ParkedTask] = {}
        self.counts: dict[tuple[TP, str], int] = {}
        self._heap: list[tuple[float, str, int, float]] = []

    def put(self, task_id: str, entry: ParkedTask) -> None:
        if self.parked.get(task_id) == entry:
            return
        self.drop(task_id)
        self.parked[task_id] = entry
        key = (entry.tp, entry.agent)
        self.counts[key] = self.counts.get(key, 0) + 1
        heapq.heappush(self._heap, (entry.due, task_id, entry.level, entry.due))

    def drop(self, task_id: str) -> None:
        entry = self.parked.pop(task_id, None)
        if entry is not None:
            key = (entry.tp, entry.agent)
            self.counts[key] -= 1
            if not self.counts[key]:
                del self.counts[key]

    def waiting(self, tp: TP, agent: str) -> int:
        return self.counts.get((tp, agent), 0)

    def due(self, now: float, retry_after: float) -> list[tuple[str, int]]:
        """(task_id, level) of every parked task whose level ran out; each is asked again after ``retry_after``
        seconds while it stays unanswered (its timeout event lost, or the ledger busy)."""
        found = []
        while self._heap and self._heap[0][0] <= now:
            _, task_id, level, due = heapq.heappop(self._heap)
            entry = self.parked.get(task_id)
            if entry is None or (entry.level, entry.due) != (level, due):
                continue  # decided or escalated since: a newer entry (or none) stands for it
            found.append((task_id, level))
            heapq.heappush(self._heap, (now + retry_after, task_id, level, due))
        return found

    def forget(self, tps: set[TP]) -> None:
        for task_id in [t for t, entry in self.parked.items() if entry.tp in tps]:
            self.drop(task_id)


class Scanner:
    """Open tasks and parked ones (in memory, kept by ``note``, made whole by ``reindex`` after each rebalance),
    and the lease and approval-timeout scans."""

    def __init__(self, settings: Settings, executor: Runs, tasks: KeyedTable, timers: KeyedTable) -> None:
        self.settings = settings
        self.executor = executor
        self.tasks = tasks
        #: tasks parked for a decision or running after one: their offsets are committed, so no redelivery
        #: brings them back; ``reindex`` finds them here (a small table)
        self.timers = timers
        self.open_tasks: dict[str, OpenTask] = {}
        #: tasks awaiting a decision on this worker's partitions, with their due times
        self.index = DueIndex()
        #: a rebalance's reindex has not read the timers table yet (it failed): the next scan tries again
        self.reindex_due = False
        #: the worker ids the group counted as members at the last rebalance (None: not known); a lease held by a
        #: worker outside it is not waited out (``gone``)
        self.members: frozenset[str] | None = None
        #: dispatches of this worker that wait for their lease record to be durable (ledger/effects.py), by task:
        #: (partition, dispatch). Their lease is this live worker's, whatever the broker's delay (``running_here``)
        self.starting: dict[str, tuple[TP, int]] = {}

    def note(self, task_id: str, record: TaskRecord) -> None:
        """The task's record as the ledger just wrote (or read) it."""
        if record.state == AWAITING_APPROVAL:
            approval = approvals.state(record)
            self.index.put(task_id, ParkedTask(
                TP(record.topic, record.partition), record.agent, int(approval.get("level", 0)),
                float(approval.get("due", float("inf"))),
            ))
        else:
            self.index.drop(task_id)
        if record.terminal or record.state in (AWAITING_APPROVAL, AWAITING_SUBTASKS):  # no lease to watch
            self.open_tasks.pop(task_id, None)
        else:
            self.open_tasks[task_id] = OpenTask(
                TP(record.topic, record.partition), record.dispatch, record.lease_until, owner=record.owner,
            )

    def start(self, task_id: str, tp: TP, dispatch: int) -> None:
        """Dispatch ``dispatch`` of the task starts here once its lease record is durable."""
        self.starting[task_id] = (tp, dispatch)

    def started(self, task_id: str, dispatch: int) -> None:
        """Dispatch ``dispatch`` no longer waits: it started, its record moved on, or its partition moved."""
        if self.starting.get(task_id, (None, None))[1] == dispatch:
            del self.starting[task_id]

    def running_here(self, task_id: str, dispatch: int | None) -> bool:
        """This worker runs ``dispatch`` of the task, or starts it once its lease record is durable: a lease of a
        live owner, renewed rather than let lapse. A lease record can wait on a cut-off changelog leader for
        longer than the lease; lapsing it re-dispatched the task here, each dispatch waiting in turn, until
        max_attempts dead-lettered a task that never ran (docs/cluster.md)."""
        if self.executor.has(task_id):
            return True
        waiting = self.starting.get(task_id)
        return waiting is not None and dispatch is not None and waiting[1] == dispatch

    def gone(self, owner: str) -> bool:
        """The lease's owner is not a member of the group (as of the last rebalance): it died or was cut off and
        expelled, or this worker took its place under its static membership id, so it can no longer act for the
        partition and its lease need not be waited out."""
        if self.members is None:
            return False
        me = self.executor.worker_id
        if owner == me:
            return False
        return replaced_by(owner, me) or not in_group(owner, self.members)

    def learned_members(self, members: frozenset[str] | None) -> None:
        """The group's members after a rebalance (``kafka.admin.group_members``); None when they could not be read
        (leases are then waited out, as before)."""
        self.members = members

    def awaiting_in(self, tp: TP, agent: str) -> int:
        """How many tasks of ``agent`` await a decision on partition ``tp`` (from memory)."""
        return self.index.waiting(tp, agent)

    def approvals_pending(self, agents: list[str]) -> dict[str, int]:
        """How many tasks of each agent await a decision on this worker's partitions (from memory: no table read)."""
        counts = dict.fromkeys(agents, 0)
        for (_, agent), n in self.index.counts.items():
            counts[agent] = counts.get(agent, 0) + n
        return counts

    def scan(self, now: float) -> list[tuple[str, int]]:
        """Tasks whose lease lapsed and that no local slot runs: ask the ledger (via an event) to re-dispatch."""
        due = []
        for task_id, info in self.open_tasks.items():
            if (now < info.lease_until and not self.gone(info.owner)) or self.running_here(task_id, info.dispatch):
                continue
            if now - info.requested < max(1.0, self.settings.lease_ttl_s / 4):
                continue
            info.requested = now
            due.append((task_id, info.dispatch))
        return due

    def scan_gone(self, now: float) -> list[tuple[str, int]]:
        """Tasks whose lease is held by a worker that left the group (``gone``): taken over without waiting out
        the lease. Cheap enough for a tick a second (memory only, and nothing when every owner is a member)."""
        if self.members is None:
            return []
        due = []
        for task_id, info in self.open_tasks.items():
            if not self.gone(info.owner) or self.running_here(task_id, info.dispatch) or now - info.requested < 1.0:
                continue
            info.requested = now
            due.append((task_id, info.dispatch))
        return due

    def scan_parked(self, now: float) -> list[tuple[str, int]]:
        """Approvals whose level timed out, as (task_id, level), from the due-time index (no table read)."""
        if self.reindex_due:
            self.after_rebalance()
        return self.index.due(now, max(1.0, self.settings.lease_ttl_s / 4))

    def reindex(self) -> int:
        """Read the timers table once (after a rebalance, its partitions recovered): every parked task joins the
        index, and tasks running after a decision join the lease scan. Returns how many tasks are parked."""
        for task_id, record in self._timed():
            if not record.terminal and (record.state == AWAITING_APPROVAL or task_id not in self.open_tasks):
                self.note(task_id, record)
        return len(self.index.parked)

    def after_rebalance(self) -> None:
        """The tables are recovered: ``reindex``. It runs inside Faust's recovery, where an exception crashes the
        worker; a table that cannot be read now (a store the next rebalance closed) is read by the next scan."""
        self.reindex_due = True
        try:
            self.reindex()
        except Exception as exc:
            log.warning("Reading the timers table after a rebalance failed (%r); parked tasks join the approval "
                        "scan on its next tick, which reads it again. Report it with this log if it repeats", exc)
            return
        self.reindex_due = False

    def parked(self) -> Iterator[tuple[str, TaskRecord]]:
        """The tasks awaiting a decision on this worker's partitions, read from the table (for /approvals)."""
        for task_id in list(self.index.parked):
            record = record_of(self.tasks, task_id)
            if record is not None and record.state == AWAITING_APPROVAL:
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
        self.starting = {t: held for t, held in self.starting.items() if held[0] not in tps}
        self.index.forget(tps)
