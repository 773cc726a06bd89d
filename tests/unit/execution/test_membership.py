"""A run acts only while this worker is the group member it was dispatched to (execution/membership.py).

The pure checks run on a fake clock; the executor's on fake LLM servers over HTTP (tests/unit/fake_worker.py),
asserted on the requests the provider received and the outcome events the run sent.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agents_stream.contract.errors import Fenced
from agents_stream.contract.models import TaskPayload
from agents_stream.execution.membership import GatedAdmission, Membership
from agents_stream.execution.run import Run
from agents_stream.resilience.circuit import Permit
from agents_stream.testing.fakellm import FakeLLM, ok, status
from tests.unit.fake_worker import worker


class Group:
    """What the Kafka client says of this worker (its member id, when the group last accepted a commit of it) and
    a fake clock; each wait advances the clock and plays the next change of ``script``."""

    def __init__(self, member: str | None = "m1") -> None:
        self.member = member
        self.now = 100.0
        self.confirmed_at: float | None = 99.0
        self.waits: list[float] = []
        #: what happens while a run waits: (member id, a commit accepted now), one per wait
        self.script: list[tuple[str | None, bool]] = []

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds
        if self.script:
            self.member, accepted = self.script.pop(0)
            if accepted:
                self.confirmed_at = self.now

    def membership(self, wait_s: float = 1.0, *, watching: bool = True) -> Membership:
        membership = Membership(lambda: self.member, lambda: self.confirmed_at, stall_s=3.0, wait_s=wait_s,
                                tick_s=0.25, clock=lambda: self.now, sleep=self.sleep)
        if watching:  # as if its watch had started now (watch() itself never returns on this fake clock)
            membership.start_watch()
        return membership


def ticking(group: Group, membership: Membership, seconds: float) -> None:
    """``seconds`` of a loop that runs: the watch ticks every 0.25 s."""
    for _ in range(round(seconds / 0.25)):
        group.now += 0.25
        membership.tick()


def a_run(member: str | None) -> Run:
    task = TaskPayload(task_id="t1", agent_name="a", instruction="Summarise the report.")
    return Run(task, 3, "w1", member=member)


async def test_a_member_under_its_dispatch_id_acts_at_once_through_rebalances_and_slow_commits() -> None:
    """The id is the same (a rebalance the worker stays in keeps it), and the loop never stood still: no wait, even
    though the group has accepted no commit for longer than a session (commits fail while the group rebalances)."""
    group = Group()
    membership = group.membership()
    for _ in range(4):
        ticking(group, membership, 3.0)
        await membership.check(a_run("m1"))
    assert group.waits == [] and group.confirmed_at == 99.0


@pytest.mark.parametrize("now", ["m2", ""], ids=["joined-again", "joining-again"])
async def test_a_run_of_a_worker_the_group_expelled_is_fenced(now: str) -> None:
    """A new member id (joined again after being expelled) or none (joining again): the task's partition has
    another owner, who runs it; this run must not call anything."""
    group = Group(member=now)
    with pytest.raises(Fenced, match="left the group after dispatch 3"):
        await group.membership().check(a_run("m1"))
    assert group.waits == []


async def test_after_a_stall_a_run_waits_and_goes_on_once_the_group_accepts_a_commit_under_the_same_id() -> None:
    """The loop stood still 12 s (a stop, or a starved CPU) but the group kept the worker: it goes on."""
    group = Group()
    membership = group.membership()
    group.now += 12.0
    group.script = [("m1", False), ("m1", True)]
    await membership.check(a_run("m1"))
    assert group.waits == [0.25, 0.25]
    ticking(group, membership, 1.0)
    await membership.check(a_run("m1"))  # confirmed since: no more waiting
    assert group.waits == [0.25, 0.25]


async def test_woken_after_being_expelled_a_run_waits_for_the_refused_heartbeat_and_is_fenced() -> None:
    """Stopped past its session (SIGSTOP): as it wakes its id is still the old one (its next heartbeat has not been
    refused yet), so the run waits; the heartbeat is refused (no id while it joins again): Fenced, before any call."""
    group = Group()
    membership = group.membership()
    group.now += 12.0
    group.script = [("m1", False), ("", False)]
    with pytest.raises(Fenced, match="joining again"):
        await membership.check(a_run("m1"))
    assert group.waits == [0.25, 0.25]


async def test_the_watch_notices_a_stall_while_no_run_calls_and_the_next_run_waits_for_the_group() -> None:
    """The event loop really stands still (a blocking call here); the watch notices as it wakes, so the run that
    calls next waits until the group accepts a commit sent after the stall."""
    confirmed = [time.monotonic()]
    membership = Membership(lambda: "m1", lambda: confirmed[0], stall_s=0.2, wait_s=5.0, tick_s=0.02)
    watch = asyncio.ensure_future(membership.watch())
    try:
        await asyncio.sleep(0.1)
        time.sleep(0.3)  # noqa: ASYNC251 - the stall under test
        await asyncio.sleep(0.05)
        assert membership.stalled_at is not None
        check = asyncio.ensure_future(membership.check(a_run("m1")))
        await asyncio.sleep(0.1)
        assert not check.done()
        confirmed[0] = time.monotonic()
        await asyncio.wait_for(check, 1.0)
        assert membership.stalled_at is None
    finally:
        watch.cancel()


async def test_a_run_dispatched_after_a_stall_does_not_wait_even_before_the_worker_ever_committed() -> None:
    """A worker's start stands still too, before it has committed anything: a run dispatched from a record read
    since then goes on at once (waiting for a commit would wait for its own offset); one dispatched before waits."""
    group = Group()
    group.confirmed_at = None
    membership = group.membership()
    before = a_run("m1")
    membership.stamp(before)
    group.now += 7.0
    membership.tick()  # the watch wakes: the stall is noticed
    after = a_run(None)
    membership.stamp(after)
    await membership.check(after)
    assert group.waits == [] and after.member == "m1"
    with pytest.raises(Fenced, match="within 1s"):
        await membership.check(before)


async def test_a_worker_still_starting_is_not_stalled() -> None:
    """Before the watch starts (the worker's start, recovery and all), time passing is no stall: nothing waits."""
    group = Group()
    group.confirmed_at = None
    membership = group.membership(watching=False)
    run = a_run("m1")
    membership.stamp(run)
    group.now += 30.0
    await membership.check(run)
    assert group.waits == [] and membership.stalled_at is None


async def test_a_worker_the_group_never_confirms_after_a_stall_stops_the_run_after_the_wait() -> None:
    group = Group()
    membership = group.membership(wait_s=1.0)
    group.now += 12.0
    with pytest.raises(Fenced, match="within 1s of its event loop standing still"):
        await membership.check(a_run("m1"))
    assert sum(group.waits) == pytest.approx(1.0)


async def test_a_run_dispatched_before_the_client_knew_its_id_is_checked_for_stalls_only() -> None:
    group = Group(member="m9")
    await group.membership().check(a_run(None))
    await group.membership().check(a_run(""))
    assert group.waits == []


class Circuits:
    """Permits at once; ``during_wait`` runs inside the next acquire (what happens while a run waits for one)."""

    def __init__(self) -> None:
        self.acquired: list[str] = []
        self.released: list[str] = []
        self.during_wait: list[Any] = []

    async def acquire(self, provider: str) -> Permit:
        if self.during_wait:
            self.during_wait.pop(0)()
        self.acquired.append(provider)
        return Permit(provider)

    def release(self, permit: Permit, result: str, *, retry_after: float | None = None) -> None:
        self.released.append(result)


async def test_a_permit_whose_wait_lived_through_a_stall_is_given_back_until_the_group_confirms_the_worker() -> None:
    """Checked, then waiting for a permit while the process stood still for 12 s: the permit is given back
    (neutral), and the attempt waits for the group; confirmed, it goes on with a new permit."""
    circuits, group = Circuits(), Group()
    membership = group.membership(wait_s=5.0)
    gated = GatedAdmission(circuits, membership, a_run("m1"))

    def stall() -> None:
        group.now += 12.0

    circuits.during_wait.append(stall)
    group.script = [("m1", False), ("m1", True)]  # the group confirms the worker on the second look
    permit = await gated.acquire("tool:refund")
    assert permit.provider == "tool:refund"
    assert circuits.released == ["neutral"] and circuits.acquired == ["tool:refund", "tool:refund"]
    assert len(group.waits) == 2


async def test_a_permit_whose_wait_lived_through_a_stall_the_group_never_confirms_is_fenced() -> None:
    circuits, group = Circuits(), Group()
    gated = GatedAdmission(circuits, group.membership(wait_s=1.0), a_run("m1"))
    circuits.during_wait.append(lambda: setattr(group, "now", group.now + 12.0))
    with pytest.raises(Fenced, match="within 1s of its event loop standing still"):
        await gated.acquire("tool:refund")
    assert circuits.released == ["neutral"] and circuits.acquired == ["tool:refund"]


async def test_a_model_call_that_waited_for_a_permit_through_a_stall_waits_for_the_group_before_it_goes_out() -> None:
    """The provider takes one call at a time: t2 passes its check, then waits for t1's permit; meanwhile the worker's
    loop stands still for 12 s. When the permit comes, t2's call does not go out until the group confirms the worker
    (a worker stopped past its session may have lost t2 to another member, which runs it)."""
    offset = [0.0]
    confirmed: list[float | None] = [time.monotonic()]
    membership = Membership(lambda: "m1", lambda: confirmed[0], stall_s=3.0, wait_s=10.0, tick_s=0.05,
                            clock=lambda: time.monotonic() + offset[0])
    async with FakeLLM([ok("t1 done", latency=0.5)], default=ok("t2 done")) as p:
        async with worker({"p": p}, {"providers": ["p"]}, membership=membership,
                          providers={"p": {"max_concurrency": 1}}) as w:
            w.dispatch("t1")
            await w.until(lambda: len(p.requests) == 1, what="t1's call")
            w.dispatch("t2")
            await asyncio.sleep(0.1)  # t2 checked and waits for the permit
            offset[0] += 12.0  # the loop stood still (as a stopped process finds on waking)
            await w.until(lambda: w.events("t1", "succeeded"), what="t1's result")
            await asyncio.sleep(0.5)
            assert len(p.requests) == 1, "t2's call went out before the group confirmed the worker after the stall"
            confirmed[0] = time.monotonic() + offset[0]
            await w.until(lambda: w.events("t2", "succeeded"), what="t2's result once confirmed")
    assert len(p.requests) == 2


def test_may_act_now_says_what_check_would_without_waiting() -> None:
    group = Group()
    membership = group.membership()
    run = a_run("m1")
    assert membership.may_act_now(run)
    group.now += 12.0  # stood still: not until the group confirms it again
    assert not membership.may_act_now(run)
    group.now += 0.25
    group.confirmed_at = group.now  # a heartbeat accepted since the stall
    assert membership.may_act_now(run)
    group.member = "m2"  # expelled and joined again: never
    assert not membership.may_act_now(run)


async def test_a_tool_attempt_of_an_expelled_worker_never_reaches_the_tools_breaker() -> None:
    circuits, group = Circuits(), Group()
    gated = GatedAdmission(circuits, group.membership(), a_run("m1"))
    await gated.acquire("tool:refund")
    group.member = "m2"
    with pytest.raises(Fenced):
        await gated.acquire("tool:refund")
    assert circuits.acquired == ["tool:refund"]


async def test_a_run_whose_worker_the_group_expels_during_its_backoff_asks_the_provider_no_more() -> None:
    """The first call fails; while the run backs off, the worker is expelled (its member id is gone): the retry
    is never sent, no result either, and the run releases its lease so the partition's owner takes it over."""
    group = Group()
    membership = Membership(lambda: group.member, lambda: time.monotonic(), stall_s=3.0, wait_s=5.0)
    async with FakeLLM([status(500)], default=ok("from a worker that lost the task")) as p:
        settings = {"backoff_base_s": 0.4, "backoff_cap_s": 0.4}
        async with worker({"p": p}, {"providers": ["p"]}, settings=settings, membership=membership) as w:
            w.dispatch("t1", dispatch=3)
            await w.until(lambda: len(p.requests) == 1, what="the first call")
            group.member = ""
            await w.until(lambda: w.events("t1", "expired"), what="the run's release")
            await asyncio.sleep(0.6)  # past the backoff: a retry would have gone out by now
    assert len(p.requests) == 1
    assert [(e["dispatch"], e.get("released")) for e in w.events("t1", "expired")] == [(3, True)]
    assert w.events("t1", "succeeded") == [] and w.events("t1", "failed") == []


@pytest.mark.parametrize(("now", "fenced"), [("m1", False), ("m2", True), ("", False), (None, False)],
                         ids=["same-id", "joined-again", "leaving", "stopped"])
def test_an_outcome_is_fenced_only_once_the_worker_joined_again_under_a_new_id(now: str | None, fenced: bool) -> None:
    """A run's outcome is not sent once the worker is back under a new member id (the partition may be its own
    again, but not the dispatch); a worker leaving the group (no id while it stops) still sends the outcomes of the
    runs it lets finish, and a run dispatched before the id was known is never fenced by it."""
    group = Group(member=now)
    membership = group.membership()
    if fenced:
        with pytest.raises(Fenced, match="joined again under a new member id"):
            membership.verify_outcome(a_run("m1"))
    else:
        membership.verify_outcome(a_run("m1"))
    membership.verify_outcome(a_run(None))
    assert group.waits == []


async def test_a_final_answer_that_arrives_after_the_worker_joined_again_is_not_sent() -> None:
    """The model answers while the worker is expelled and back under a new id (its partitions may be its own
    again): the run sends no result and releases its lease, so the partition's owner decides the task from its
    journal."""
    group = Group()
    membership = Membership(lambda: group.member, lambda: time.monotonic(), stall_s=3.0, wait_s=5.0)
    async with FakeLLM(default=ok("from a worker that left the group", latency=0.5)) as p:
        async with worker({"p": p}, {"providers": ["p"]}, membership=membership) as w:
            w.dispatch("t1", dispatch=3)
            await w.until(lambda: len(p.requests) == 1, what="the model call")
            group.member = "m2"
            await w.until(lambda: w.events("t1", "expired"), what="the run's release")
    assert w.events("t1", "succeeded") == [] and w.events("t1", "failed") == []
    assert [(e["dispatch"], e.get("released")) for e in w.events("t1", "expired")] == [(3, True)]


def test_a_worker_is_confirmed_while_the_group_accepted_a_commit_or_heartbeat_within_half_a_session() -> None:
    group = Group()
    membership = group.membership()  # stall_s 3 s; the last acceptance 1 s ago
    assert membership.confirmed()
    group.now += 2.5
    assert not membership.confirmed(), "3.5 s without an accepted commit or heartbeat"
    group.confirmed_at = None
    assert not membership.confirmed()
