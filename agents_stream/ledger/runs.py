"""What the ledger needs of the runs on this worker (the executor, ``execution/executor.py``): start one, stop one,
ask one to stop at its next safe point, hand one a cache reply, and whether one is here. The ledger depends on this
seam only, so a test gives it a small typed fake instead of an executor."""

from __future__ import annotations

from typing import Any, Protocol

from agents_stream.contract.events import CachedAnswer
from agents_stream.contract.models import TaskPayload

__all__ = ["Runs"]


class Runs(Protocol):
    """The runs going on in this worker, as the ledger starts and stops them."""

    @property
    def worker_id(self) -> str:
        """The worker these runs are on (a lease names it); the ledger only reads it."""
        ...

    def has(self, task_id: str) -> bool:
        """A run of ``task_id`` is here: queued, held or calling."""
        ...

    def dispatch(
        self, task: TaskPayload, dispatch: int, steps_done: list[Any] | None = None, trace: str | None = None,
    ) -> None:
        """Start a run of ``task`` as its ``dispatch``-th attempt, resuming after ``steps_done``; never blocks."""
        ...

    def cancel(self, task_id: str) -> None:
        """Stop the run of ``task_id`` here, wherever it is; no outcome is sent for it."""
        ...

    def interrupt(self, task_id: str) -> None:
        """A conversation's round stops at its next safe point (a new message came)."""
        ...

    def cache_answer(self, task_id: str, answer: CachedAnswer | None) -> None:
        """The cache's reply to a lookup a run here made."""
        ...
