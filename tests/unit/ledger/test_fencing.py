"""Fencing without a broker: a worker whose partition moved, or that the group has not confirmed lately, never acts
on what it wrote there; the ledger refuses outcomes of a run that no longer holds the lease; a lease held by a
worker that left the group is taken over at once (docs/security.md, "Fencing")."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any

import pytest
from agents_stream.tables import leases
from agents_stream.tables.leases import RUNNING, Dispatch, TaskRecord
from faust.types import TP

from agents_stream.contract.errors import Fenced
from agents_stream.contract.events import JournalEntry
from agents_stream.kafka.members import client_id, in_group, instance_of, members_of, replaced_by, worker_id
from agents_stream.kafka.outbox import Outbox
from agents_stream.kafka.watermark import Watermark
from agents_stream.ledger.route import OutcomeRoute
from agents_stream.ledger.scanner import Scanner
from agents_stream.settings import Settings
from tests.unit.ledger_fakes import FakeRuns, NotHolding, PlainTable

TP1 = TP("agent.tasks.a", 1)
PAYLOAD = '{"task_id":"t1","agent_name":"a","instruction":"x"}'


def _record(*, dispatch: int = 2, owner: str = "w2", lease_until: float = 1_030.0, **kw: Any) -> TaskRecord:
    return TaskRecord(state=RUNNING, agent="a", dispatch=dispatch, owner=owner, lease_until=lease_until,
                      payload=PAYLOAD, topic=TP1.topic, partition=1, offset=5, received_at=1_000.0, **kw)


# -- the ledger refuses a stale run -------------------------------------------------------------------------------


def test_a_journal_entry_of_a_run_that_was_taken_over_is_not_kept() -> None:
    """The scenario of the double charge: dispatch 1 (cut off) reports its turn after dispatch 2 took over."""
    record = _record(dispatch=2, steps_done='[{"kind":"turn","turn":1}]')
    new, effects = leases.checkpoint(record, index=1, output={"kind": "turn", "turn": 2}, dispatch=1)
    assert new is record and effects == []
    kept, _ = leases.checkpoint(record, index=1, output={"kind": "turn", "turn": 2}, dispatch=2)
    assert kept is not None and kept.steps_done is not None and '"turn":2' in kept.steps_done


def test_a_final_outcome_of_a_run_that_was_taken_over_ends_nothing() -> None:
    record = _record(dispatch=2)
    new, effects = leases.finish(record, status="succeeded", result="{}", reason=None, now=1_001.0, dispatch=1)
    assert new is record and effects == []
    ended, effects = leases.finish(record, status="succeeded", result="{}", reason=None, now=1_001.0, dispatch=2)
    assert ended is not None and ended.state == "succeeded" and effects


def test_a_lease_of_a_worker_that_left_the_group_is_taken_over_before_it_lapses() -> None:
    record = _record(dispatch=1, owner="w-dead", lease_until=1_030.0)
    kept, effects = leases.expire(record, dispatch=1, now=1_005.0, me="w2", ttl=30.0, max_attempts=3,
                                  running_here=False)
    assert kept is record and effects == [], "a member's lease is waited out"
    new, effects = leases.expire(record, dispatch=1, now=1_005.0, me="w2", ttl=30.0, max_attempts=3,
                                 running_here=False, owner_gone=True)
    assert new is not None and new.dispatch == 2 and new.owner == "w2" and Dispatch(2) in effects


# -- the outbox runs a transition's follow-ups only while the partition is this worker's -----------------------------


class Producer:
    def __init__(self) -> None:
        self.futures: list[asyncio.Future[Any]] = []

    def channel(self, topic: str) -> ProducerTopic:
        return ProducerTopic(self)


@dataclass
class ProducerTopic:
    """A topic of the Producer (``kafka.outbox.Channel``): its sends wait for the test to confirm them."""

    producer: Producer

    def send_soon(self, *, key: Any, value: Any, partition: Any = None, headers: Any = None) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.producer.futures.append(fut)
        return fut


def _outbox(member: Any = lambda: True) -> tuple[Outbox, Producer]:
    producer = Producer()
    outbox = Outbox(producer.channel, Watermark(), "w1", find_dead_letter=_no_lookup, member=member,
                    retry_delay=lambda attempt: 0.01, member_wait_s=0.5)
    return outbox, producer


async def _no_lookup(dlq: str, source: tuple[str, int, int], since: float) -> None:
    return None


async def _spin(n: int = 10) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_write_confirmed_after_its_partition_was_revoked_is_not_acted_on() -> None:
    """The zombie's journal entry: its changelog send is acknowledged after the partition moved. The follow-up (the
    loop's go-ahead for the tool call) must not run; the fenced callback runs instead."""
    outbox, producer = _outbox()
    acted: list[str] = []
    outbox.deliver(TP1, 5, [outbox.record("t", b"k", b"v")], [lambda: acted.append("tool call")], fence=True,
                   fenced=lambda: acted.append("fenced"))
    outbox.watermark.forget({TP1})  # revoked
    producer.futures[0].set_result("ok")
    await _spin()
    assert acted == ["fenced"]


async def test_a_write_confirmed_while_the_group_has_not_confirmed_the_worker_waits_for_it() -> None:
    confirmed = [False]
    outbox, producer = _outbox(member=lambda: confirmed[0])
    acted: list[str] = []
    outbox.deliver(TP1, 5, [outbox.record("t", b"k", b"v")], [lambda: acted.append("go")], fence=True,
                   fenced=lambda: acted.append("fenced"))
    producer.futures[0].set_result("ok")
    await asyncio.sleep(0.25)
    assert acted == [] and outbox.watermark.commit_offset(TP1) == 5, "held, not acted on"
    confirmed[0] = True
    await asyncio.sleep(0.3)
    assert acted == ["go"] and outbox.watermark.open_count(TP1) == 0


async def test_a_burst_confirmed_while_the_worker_is_unconfirmed_waits_in_one_loop_and_goes_on_in_order() -> None:
    """B1's burst, when a commit round was slow: every confirmed delivery waits for the group to confirm this worker.
    One loop looks for them all (a loop and a timer each made the worker spend its CPU waking them), and once the
    worker is confirmed they go on in the order they were confirmed."""
    confirmed = [False]
    outbox, producer = _outbox(member=lambda: confirmed[0])
    acted: list[int] = []
    for offset in range(500):
        outbox.deliver(TP1, offset, [outbox.record("t", b"k", b"v")], [lambda o=offset: acted.append(o)],
                       fence=True, fenced=lambda: acted.append(-1))
    for fut in producer.futures:
        fut.set_result("ok")
    await _spin()
    assert acted == [] and outbox.delivering() == 1, "one waiting loop, not one per delivery"
    confirmed[0] = True
    await asyncio.sleep(0.3)
    assert acted == list(range(500)) and outbox.watermark.open_count(TP1) == 0 and outbox.delivering() == 0


async def test_a_worker_never_confirmed_again_is_fenced_and_its_offset_released() -> None:
    outbox, producer = _outbox(member=lambda: False)
    acted: list[str] = []
    outbox.deliver(TP1, 5, [outbox.record("t", b"k", b"v")], [lambda: acted.append("go")], fence=True,
                   fenced=lambda: acted.append("fenced"))
    producer.futures[0].set_result("ok")
    await asyncio.sleep(0.9)
    assert acted == ["fenced"] and outbox.watermark.open_count(TP1) == 0


async def test_a_write_of_a_revoked_partition_is_not_sent_again() -> None:
    """The outbox re-sends a failed changelog write with the key's current value: never once the partition moved
    (the new owner's state is what counts; this worker's copy is stale)."""
    outbox, producer = _outbox()
    acted: list[str] = []
    outbox.deliver(TP1, 5, [outbox.record("t", b"k", b"v")], [lambda: acted.append("go")], fence=True,
                   fenced=lambda: acted.append("fenced"))
    producer.futures[0].set_exception(ConnectionError("broker away"))
    await _spin()
    outbox.watermark.forget({TP1})
    await asyncio.sleep(0.2)
    assert len(producer.futures) == 1, "not sent again"
    assert acted == ["fenced"]


async def test_without_fence_the_follow_ups_run_once_confirmed() -> None:
    """A poison message's dead letter keeps its own markers across owners: its follow-ups are not fenced."""
    outbox, producer = _outbox(member=lambda: False)
    acted: list[str] = []
    outbox.deliver(TP1, 5, [outbox.record("t", b"k", b"v")], [lambda: acted.append("marked")])
    outbox.watermark.forget({TP1})
    producer.futures[0].set_result("ok")
    await _spin()
    assert acted == ["marked"]


# -- a journal entry that goes on the outcomes topic is not acted on ---------------------------------------------------


def _confirming(sent: list[bytes]) -> Any:
    """A produce whose sends the broker confirms at once, their values kept in ``sent``."""
    def produce(key: bytes, value: bytes) -> asyncio.Future[Any]:
        sent.append(value)
        fut = asyncio.get_running_loop().create_future()
        fut.set_result("ok")
        return fut

    return produce


async def test_a_journal_entry_sent_to_the_partitions_owner_stops_the_run() -> None:
    sent: list[bytes] = []
    produce = _confirming(sent)
    ledger = NotHolding()  # this ledger does not hold the task
    route = OutcomeRoute(ledger, produce, member=lambda: True,
                         send_control=lambda *a: None, stopping=lambda: False, owns=lambda task_id: False)
    with pytest.raises(Fenced):
        await route.send("t1", JournalEntry(worker="w1", dispatch=1, index=3, output={"kind": "turn"}))
    assert len(sent) == 1, "the entry still goes to the owner, who keeps it if the run holds the lease"


async def test_a_journal_entry_of_a_resumed_task_on_this_workers_own_partition_goes_on() -> None:
    """A task resumed after a decision or its sub-tasks holds no offset here: its entries go on the topic to this
    worker's own ledger, and the loop goes on once the broker has them."""
    sent: list[bytes] = []
    produce = _confirming(sent)
    route = OutcomeRoute(NotHolding(), produce,
                         member=lambda: True, send_control=lambda *a: None, stopping=lambda: False,
                         owns=lambda task_id: True)
    await route.send("t1", JournalEntry(worker="w1", dispatch=2, index=3, output={"kind": "turn"}))
    assert len(sent) == 1


# -- who is in the group ----------------------------------------------------------------------------------------------


def test_members_are_read_from_client_ids_of_a_stable_group_only() -> None:
    stable = {"error_code": 0, "state": "Stable", "members": [
        {"client_id": client_id("host:1:aa")}, {"client_id": client_id("host:2:bb")}, {"client_id": "other-tool"},
    ]}
    assert members_of(stable) == frozenset({"host:1:aa", "host:2:bb"})
    assert members_of({**stable, "state": "PreparingRebalance"}) is None
    assert members_of({**stable, "error_code": 16}) is None


def test_the_scanner_takes_over_only_leases_of_workers_outside_the_group() -> None:
    scanner = Scanner(Settings(), FakeRuns(worker_id="w2"), PlainTable(), PlainTable())
    scanner.note("t-dead", _record(dispatch=1, owner="w-dead"))
    scanner.note("t-alive", _record(dispatch=1, owner="w3"))
    scanner.note("t-mine", _record(dispatch=1, owner="w2"))
    assert scanner.scan_gone(1_001.0) == [], "members not known yet: every lease is waited out"
    scanner.learned_members(frozenset({"w2", "w3"}))
    assert scanner.scan_gone(1_001.0) == [("t-dead", 1)]
    assert scanner.scan_gone(1_001.5) == [], "asked once a second"
    assert scanner.scan(1_001.0) == [] or all(t == "t-dead" for t, _ in scanner.scan(1_001.0))


def test_under_static_membership_a_member_is_its_instance_id_and_its_predecessor_is_gone() -> None:
    """A process restarted under its static membership id takes its predecessor's place without a rebalance, and the
    group goes on describing the member with the predecessor's client id: members are matched by instance id."""
    me = worker_id("pod-1")
    assert me.startswith("pod-1@") and instance_of(me) == "pod-1" and instance_of(worker_id()) is None
    before, other = "pod-1@host:7:aa", "pod-2@host:8:bb"
    described = frozenset({before, "pod-2@host:3:cc"})  # pod-2 restarted too; the group kept its first client id
    assert in_group(other, described) and in_group(me, described)
    assert not in_group("pod-3@host:9:dd", described) and not in_group("host:1:aa", described)
    assert replaced_by(before, me) and not replaced_by(me, me) and not replaced_by(other, me)
    assert not replaced_by("host:1:aa", "host:2:bb"), "without static membership nobody takes another's place"

    scanner = Scanner(Settings(), FakeRuns(worker_id=me), PlainTable(), PlainTable())
    scanner.note("t-before", _record(dispatch=1, owner=before))
    scanner.note("t-other", _record(dispatch=1, owner=other))
    scanner.note("t-left", _record(dispatch=1, owner="pod-3@host:9:dd"))
    assert scanner.scan_gone(1_001.0) == [], "members not known yet: every lease is waited out"
    scanner.learned_members(described)
    assert sorted(scanner.scan_gone(1_001.0)) == [("t-before", 1), ("t-left", 1)]


def test_a_renewed_record_of_a_taken_over_task_names_the_new_owner() -> None:
    record = _record(dispatch=1, owner="w-dead")
    new, _ = leases.expire(record, dispatch=1, now=1_002.0, me="w2", ttl=30.0, max_attempts=3, running_here=False,
                           owner_gone=True)
    assert new == replace(record, dispatch=2, owner="w2", lease_until=1_032.0)


# -- the fencing token at the service ---------------------------------------------------------------------------------


async def test_a_service_refuses_a_call_of_a_worker_its_task_moved_on_from(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example services check the fencing token (the task's dispatch number) beside the idempotency key: the
    worker that took the task over (dispatch 2) charged; the cut-off one (dispatch 1) wakes and tries another key."""
    from agents_stream.examples.services import FakeServices, call_service

    async with FakeServices() as services:
        monkeypatch.setenv("AGENTS_STREAM_REFUND_SERVICES", services.url)
        status, _ = await call_service("payment.refund", "t1:1:call_B", {"amount": 5}, ("t1", 2))
        assert status == 200
        status, answer = await call_service("payment.refund", "t1:1:call_A", {"amount": 5}, ("t1", 1))
        assert status == 409 and "stale fencing token" in answer["error"]
        status, _ = await call_service("payment.refund", "t1:1:call_B", {"amount": 5}, ("t1", 1))
        assert status == 200, "a replay of a key already executed answers as before"
        assert services.executed("payment.refund") == ["t1:1:call_B"]
        status, _ = await call_service("payment.refund", "t2:1:call_A", {"amount": 5}, ("t2", 1))
        assert status == 200, "each task is its own resource"


async def test_a_durable_step_is_timed_once_it_is_durable_here() -> None:
    """agents_stream_journal_durable_seconds times the step a run waits on (an entry applied by this worker's
    ledger until its record is confirmed): one observation per entry, none for an entry that went on the topic."""
    from agents_stream.ops import metrics

    class Holding:
        def apply_here(self, task_id: str, outcome: Any) -> "asyncio.Future[None]":
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_later(0.01, done.set_result, None)
            return done

    def count_and_sum() -> tuple[float, float]:
        samples = {s.name: s.value for m in metrics.journal_durable.collect() for s in m.samples}
        name = "agents_stream_journal_durable_seconds"
        return samples[f"{name}_count"], samples[f"{name}_sum"]

    here = OutcomeRoute(Holding(), _confirming([]), member=lambda: True,  # type: ignore[arg-type]
                        send_control=lambda *a: None, stopping=lambda: False, owns=lambda task_id: True)
    count, total = count_and_sum()
    await here.send("t1", JournalEntry(worker="w1", dispatch=2, index=3, output={"kind": "turn"}))
    after_count, after_total = count_and_sum()
    assert after_count == count + 1 and after_total - total >= 0.01
    there = OutcomeRoute(NotHolding(), _confirming([]), member=lambda: True, send_control=lambda *a: None,
                         stopping=lambda: False, owns=lambda task_id: True)
    await there.send("t1", JournalEntry(worker="w1", dispatch=2, index=4, output={"kind": "turn"}))
    assert count_and_sum()[0] == after_count
