"""Background tasks an owner starts and does not wait for: a webhook post, a partition's seek back, a delivery's
retry, a breaker's probe. asyncio keeps only a weak reference to a task, so one nobody holds can vanish mid-run;
and what its owner started must end when its owner stops. ``Background`` holds each task until it ends and, at
``stop``, cancels those still running and waits for them, bounded."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Coroutine, TypeVar

__all__ = ["Background", "abandon"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def abandon(fut: "asyncio.Future[Any]") -> None:
    """Its owner goes on without ``fut``, raising an error of its own: cancel it if it still runs, else mark its
    exception seen (asyncio would log one never retrieved as a bug)."""
    if not fut.done():
        fut.cancel()
    elif not fut.cancelled():
        fut.exception()


class Background:
    """The running background tasks of one owner (``what`` names them in the log)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(
        self, coro: Coroutine[Any, Any, T], done: Callable[[asyncio.Task[T]], None] | None = None,
    ) -> asyncio.Task[T]:
        """Run ``coro`` in the background, held until it ends; ``done(task)`` is called when it has."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if done is not None:
            task.add_done_callback(done)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    async def stop(self, timeout: float = 5.0) -> None:
        """Cancel the tasks still running and wait up to ``timeout`` seconds for them to end."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        if pending:
            log.warning("%d %s did not end within %.0fs of being cancelled at stop; the process exits without them",
                        len(pending), self.what, timeout)
