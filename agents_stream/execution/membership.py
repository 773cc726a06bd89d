"""Whether a run may still act here: ask a model or call a tool for the task it was dispatched.

A worker the group expelled — stopped, or starved, past its session timeout — has had its partitions given to other
members, and their owners take its tasks over at once (``kafka/members.py``). When it comes back, its runs are still
in memory: a call that was in flight returns, a backoff or a hold ends, a queued run gets a slot. Each would ask the
model again, or call a tool, for a task another worker has already run — wasted calls at best (their outcomes are
fenced: docs/security.md, "Fencing"). So every provider call and every tool attempt first asks ``Membership.check``:

- the group's coordinator still knows this worker by the member id it had when the run was dispatched. A worker the
  group expelled has none while it joins again and a new one after, so a changed id means the run is stale:
  ``Fenced``, the run stops and releases its lease. A rebalance the worker stays in keeps its id: runs go on.
- and this process did not stand still since the group last confirmed it. A worker that was stopped learns that
  it was expelled only when its next heartbeat is refused, and the timers that fire as it wakes come first; so a gap
  of ``stall_s`` in this event loop (``watch`` ticks, and each check looks too) makes every run wait for the group's
  word: a commit or heartbeat accepted after the gap (not expelled: go on) or a changed id (``Fenced``), at most
  ``wait_s`` (then ``Fenced`` too: its lease lapses and the partition's owner runs the task from its journal).

The executor asks ``Membership.verify_outcome`` before sending a run's outcome (a journal entry, a checkpoint, the
final): not once the worker joined again under a new id, even when the task's partition came back to it.

A worker cut off from the brokers but not from its model provider is not stopped by this: its runs call on until
the cut heals and the group refuses its heartbeat (then the id check stops them); what they write is fenced meanwhile.
The check costs a clock read and an attribute read on a healthy worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

from agents_stream.contract.errors import Fenced
from agents_stream.execution.run import Run
from agents_stream.execution.tool_calls import Admission
from agents_stream.resilience.circuits import Permit

__all__ = ["GatedAdmission", "Membership"]

log = logging.getLogger(__name__)

#: how often the loop's watch ticks, and a waiting run looks again
TICK_S = 0.25


class Membership:
    """``member_id()``: the id the group's coordinator knows this worker by ('' while it joins again, None before its
    consumer started); ``confirmed_at()``: when (monotonic) the last commit the coordinator accepted was sent."""

    def __init__(
        self, member_id: Callable[[], str | None], confirmed_at: Callable[[], float | None], *, stall_s: float,
        wait_s: float, tick_s: float = TICK_S, clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.member_id = member_id
        self.confirmed_at = confirmed_at
        self.stall_s = stall_s
        self.wait_s = wait_s
        self._tick_s = tick_s
        self._clock = clock
        self._sleep = sleep
        #: the watch's last tick; None until it starts (a worker's start, before it, is not a stall)
        self._ticked: float | None = None
        #: when this loop was last seen to have stood still for ``stall_s`` or more, until the group confirmed it
        self.stalled_at: float | None = None

    def stamp(self, run: Run) -> None:
        """Note on a run dispatched now the member id it belongs to (None or '': unknown; only a stall is checked)
        and when: only a stall after its dispatch can have made it stale."""
        run.member = self.member_id()
        run.dispatched_at = self._clock()

    def tick(self) -> bool:
        """One look of the watch: note a gap in this loop since the last look; True while the group has not
        confirmed this worker since the last gap."""
        now = self._clock()
        if self._ticked is None:
            return False  # not watching yet: the worker is still starting, no run can have lived through a stall
        if now - self._ticked >= self.stall_s:
            if self.stalled_at is None:  # info: a worker's start stands still too, and mode logs late timers already
                log.info("This worker's event loop stood still for %.1fs (the process was stopped, or starved of CPU): "
                         "its runs make no call until the group confirms it is still a member", now - self._ticked)
            self.stalled_at = now
        self._ticked = now
        if self.stalled_at is None:
            return False
        confirmed = self.confirmed_at()
        if confirmed is not None and confirmed > self.stalled_at:
            self.stalled_at = None
            return False
        return True

    def start_watch(self) -> None:
        """From now on gaps count: before it, the worker is still starting and no run can have lived through one."""
        self._ticked = self._clock()

    async def watch(self) -> None:
        """Tick, so that a gap is noticed even when no run is calling (the executor owns this task)."""
        self.start_watch()
        while True:
            await self._sleep(self._tick_s)
            self.tick()

    def confirmed(self) -> bool:
        """The group accepted a commit or heartbeat of this worker less than ``stall_s`` ago: it still owns what it
        owned then. A worker cut off from the brokers stops being confirmed within ``stall_s`` of the cut."""
        at = self.confirmed_at()
        return at is not None and self._clock() - at < self.stall_s

    def verify_outcome(self, run: Run) -> None:
        """Raise ``Fenced`` when this worker joined the group again, under a new member id, since ``run`` was
        dispatched: the run's outcome must not be sent, even when the task's partition is this worker's again (its
        dispatch may have been run by another member meanwhile). Unlike ``check`` it never waits, and a worker
        leaving the group (no id while it stops) still sends the outcomes of the runs it lets finish."""
        now = self.member_id()
        if run.member and now and now != run.member:
            raise _left(run, now)

    def may_act_now(self, run: Run) -> bool:
        """What ``check`` would say without waiting: True when ``run`` may act now."""
        now = self.member_id()
        if run.member and now != run.member:
            return False
        if not self.tick():
            return True
        # dispatched from a record read since the stall (a worker's start stands still too, before it ever
        # committed: waiting for a commit there would wait for the run's own offset)
        return run.dispatched_at is not None and self.stalled_at is not None and run.dispatched_at >= self.stalled_at

    async def check(self, run: Run) -> None:
        """Return when ``run`` may act; raise ``Fenced`` when this worker is no longer the member it was dispatched
        under, or the group has not confirmed it within ``wait_s`` of a stall."""
        deadline: float | None = None
        while not self.may_act_now(run):
            now = self.member_id()
            if run.member and now != run.member:
                raise _left(run, now)
            if deadline is None:
                deadline = self._clock() + self.wait_s
            elif self._clock() >= deadline:
                raise Fenced(
                    f"task {run.task.task_id}: the group has not confirmed this worker within {self.wait_s:.0f}s of "
                    f"its event loop standing still; dispatch {run.dispatch} stops here and its lease lapses"
                )
            await self._sleep(self._tick_s)

    async def admit(self, run: Run, circuits: Admission, provider: str) -> Permit:
        """A permit of ``circuits`` for a call of ``run``, checked before it is asked for and again once it came: the
        wait for it may have lived through a stall, so a permit that came too late is given back (neutral) and the
        check waits for the group as ``check`` does."""
        while True:
            await self.check(run)
            permit = await circuits.acquire(provider)
            if self.may_act_now(run):
                return permit
            circuits.release(permit, "neutral")


def _left(run: Run, now: str | None) -> Fenced:
    return Fenced(
        f"task {run.task.task_id}: this worker left the group after dispatch {run.dispatch} was given to it "
        f"({'it is joining again' if not now else 'it joined again under a new member id'}); the partition's owner "
        "runs the task now"
    )


class GatedAdmission:
    """The circuits a run's tool calls go through, each attempt checked by ``membership`` first."""

    def __init__(self, circuits: Admission, membership: Membership, run: Run) -> None:
        self._circuits = circuits
        self._membership = membership
        self._run = run

    async def acquire(self, provider: str) -> Permit:
        return await self._membership.admit(self._run, self._circuits, provider)

    def release(self, permit: Permit, result: str, *, retry_after: float | None = None) -> None:
        self._circuits.release(permit, result, retry_after=retry_after)
