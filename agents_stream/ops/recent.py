"""The console's list of recent tasks and jobs: the last ones each worker's ledger changed, and all workers' merged.

A bounded list in memory per worker (``AGENTS_STREAM_CONSOLE_RECENT`` tasks and as many jobs), fed by the ledger
and the orchestrator as they apply a transition: no table scan, no broker read. A worker that restarts starts an
empty list (older tasks: look them up by id); ``GET /recent`` gathers every worker's and keeps, per id, the entry
changed last (pure).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Iterable, Mapping

from agents_stream.tables import jobs as job_machine
from agents_stream.tables.jobs import JobRecord
from agents_stream.tables.leases import TaskRecord

__all__ = ["Recent", "RecentJobs", "RecentTasks", "merge_recent"]


class Recent:
    """The last ``capacity`` ids whose state changed, each with its state and when this worker saw it change."""

    #: the name of the id field in an entry
    key = "id"

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._entries: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._final: set[str] = set()  # ids whose state can no longer change (kept across a rebalance)

    def __len__(self) -> int:
        return len(self._entries)

    def note(self, key: str, state: str, at: float, *, final: bool, **fields: Any) -> None:
        """``key`` is in ``state`` (entered at ``at``). The same state again updates the fields only: a redelivery
        or a heartbeat is no news, and keeps the time the state was entered."""
        entry = self._entries.get(key)
        if entry is not None and entry["state"] == state:
            entry.update(fields)
            return
        self._entries[key] = {self.key: key, "state": state, "at": at, **fields}
        self._entries.move_to_end(key)
        if final:
            self._final.add(key)
        else:
            self._final.discard(key)
        while len(self._entries) > self.capacity:
            gone, _ = self._entries.popitem(last=False)
            self._final.discard(gone)

    def forget(self, partitions: set[int]) -> None:
        """Partitions moved to another worker: their entries that could still change go (the new owner lists them
        when it applies their next event); finished ones stay, they cannot go stale."""
        for key in [k for k, e in self._entries.items() if e.get("partition") in partitions and k not in self._final]:
            del self._entries[key]

    def newest(self, limit: int) -> list[dict[str, Any]]:
        """At most ``limit`` entries, the latest change first."""
        ordered = sorted(self._entries.values(), key=lambda e: (e["at"], e[self.key]), reverse=True)
        return [dict(e) for e in ordered[:limit]]


class RecentTasks(Recent):
    """The ledger's recent tasks: id, agent, state, attempts, job, partition and times."""

    key = "task_id"

    def task(self, task_id: str, record: TaskRecord, job_id: str | None, now: float) -> None:
        """The ledger applied a transition of ``task_id`` (``job_id`` when the message was at hand)."""
        entry = self._entries.get(task_id)
        if job_id is None and entry is not None:
            job_id = entry.get("job_id")
        elif job_id is None:  # first seen here without its message (after a rebalance): read it from the record
            job_id = _job_of(record.payload)
        # A finished task first seen here (a redelivery after a restart) ended when its record says, not now.
        at = record.finished_at if record.terminal and entry is None and record.finished_at else now
        self.note(
            task_id, record.state, at, final=record.terminal, agent=record.agent, dispatch=record.dispatch,
            partition=record.partition, received_at=record.received_at, finished_at=record.finished_at,
            job_id=job_id,
        )


class RecentJobs(Recent):
    """The orchestrator's recent jobs: id, state, steps done of all, partition and times."""

    key = "job_id"

    def job(self, job_id: str, record: JobRecord, partition: int, now: float) -> None:
        done = sum(1 for s in record.steps.values() if s.get("status") in job_machine.FINAL)
        entry = self._entries.get(job_id)
        at = record.finished_at if record.terminal and entry is None and record.finished_at else now
        self.note(
            job_id, record.state, at, final=record.terminal, partition=partition, steps=len(record.steps),
            steps_done=done, created_at=record.created_at, finished_at=record.finished_at,
            goal=(record.goal or "")[:200] or None,
        )


def _job_of(payload: str) -> str | None:
    if '"job_id"' not in payload:  # most tasks: no decoding on the ledger's path (an escaped key is not shown)
        return None
    try:
        job_id = json.loads(payload).get("job_id")
    except (ValueError, AttributeError):
        return None
    return job_id if isinstance(job_id, str) else None


def merge_recent(shares: Iterable[Iterable[Mapping[str, Any]]], key: str, limit: int) -> list[dict[str, Any]]:
    """Every worker's entries as one list, the latest change first: per id the entry changed last (a task whose
    partition moved may be listed by its old and its new owner), at most ``limit``. Entries that are not objects
    with the id and a numeric ``at`` (another version's, or garbage) are left out."""
    best: dict[str, dict[str, Any]] = {}
    for share in shares:
        for entry in share:
            if not isinstance(entry, Mapping) or not isinstance(entry.get(key), str):
                continue
            at = entry.get("at")
            if not isinstance(at, int | float) or isinstance(at, bool):
                continue
            kept = best.get(entry[key])
            if kept is None or at > kept["at"]:
                best[entry[key]] = dict(entry)
    ordered = sorted(best.values(), key=lambda e: (e["at"], e[key]), reverse=True)
    return ordered[:limit]
