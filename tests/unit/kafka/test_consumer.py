"""The consumer Faust is given (agents_stream.kafka.consumer): pausing intake keeps the batch in delivery, and what
counts as the group's word that this worker is a member."""

from __future__ import annotations

import time
from types import SimpleNamespace

import faust
from aiokafka.protocol.group import HeartbeatRequest, SyncGroupRequest
from faust.types import TP

from agents_stream.app import Runtime
from agents_stream.kafka.consumer import WatermarkConsumer, commit_again, in_a_generation, watch_group_answers
from agents_stream.kafka.rereads import PASS_OVER_S, Rereads
from agents_stream.settings import Settings


async def _ignore(*args: object) -> None:
    return None


def test_pausing_keeps_the_batch_in_delivery() -> None:
    """Faust's getmany checks each record of a batch against the active-partition set it started with;
    a pause must take effect for the next fetch without emptying that set under the running batch."""
    app = faust.App("test-consumer-pause", broker="kafka://127.0.0.1:1")  # never started: no connection
    consumer = WatermarkConsumer(
        app.transport, callback=_ignore, on_partitions_revoked=_ignore, on_partitions_assigned=_ignore,
    )
    a, b = TP("agent.tasks.x", 0), TP("agent.tasks.x", 1)
    consumer.resume_partitions({a, b})
    # The set Faust's getmany holds while it yields a batch: the one object the override must not empty. It is
    # Faust's own method (the state WatermarkConsumer.pause_partitions replaces), not one of ours.
    in_delivery = consumer._get_active_partitions()

    consumer.pause_partitions({a})

    assert a in in_delivery, "the rest of the batch of a paused partition is still delivered"
    assert consumer.active_partitions() == {b}, "the next fetch skips the paused partition"
    assert consumer.paused_partitions() == {a}
    consumer.resume_partitions({a})
    assert consumer.active_partitions() == {a, b} and not consumer.paused_partitions()


def test_a_quiet_consumer_commits_a_managed_partition_again_to_learn_it_is_still_a_member() -> None:
    """With nothing new to commit, one managed partition's committed offset is committed again (a no-op for the
    group), so outcomes can still be applied where they ran; never a partition without a commit, or unmanaged."""
    a, b, other = TP("agent.tasks.x", 0), TP("agent.tasks.x", 1), TP("agent.outcomes.app", 0)
    managed = frozenset({"agent.tasks.x"})
    assert commit_again([other, b, a], {a: None, b: 7, other: 3}, managed) == {b: 7}
    assert commit_again([b, a], {a: 0, b: 7}, managed) == {a: 0}
    assert commit_again([other], {other: 3}, managed) == {}
    assert commit_again([a], {}, managed) == {}


def test_membership_is_fresh_only_for_the_time_asked() -> None:
    app = faust.App("test-consumer-member", broker="kafka://127.0.0.1:1")  # never started: no connection
    consumer = WatermarkConsumer(
        app.transport, callback=_ignore, on_partitions_revoked=_ignore, on_partitions_assigned=_ignore,
    )
    assert not consumer.member_since(60.0), "no commit accepted yet"
    consumer.member_at = time.monotonic() - 3.0
    assert consumer.member_since(5.0) and not consumer.member_since(2.0)


class _Answer:
    def __init__(self, error_code: int) -> None:
        self.error_code = error_code


class _Coordinator:
    """aiokafka's group coordinator as watch_group_answers sees it: one request method, answers given in order."""

    def __init__(self, *codes: int) -> None:
        self.codes = list(codes)

    async def _send_req(self, request: object) -> _Answer:
        return _Answer(self.codes.pop(0))


async def test_only_a_heartbeat_the_coordinator_accepted_confirms_membership() -> None:
    """A worker busy in a burst commits seldom (Faust flushes its producer before each commit): an accepted
    heartbeat says it is a member as well. A refused one (rebalance under way: 27, illegal generation: 22, unknown
    member: 25) or another request's answer says nothing."""
    coordinator = _Coordinator(27, 22, 25, 0, 0)
    seen: list[float] = []
    watch_group_answers(coordinator, seen.append)
    heartbeat = HeartbeatRequest("group", 3, "member-1")
    before = time.monotonic()
    for _ in range(3):
        await coordinator._send_req(heartbeat)
    assert seen == [], "a refused heartbeat is no word from the group"
    await coordinator._send_req(object())  # any other request the coordinator sends
    assert seen == [], "only heartbeats are read here (accepted commits are counted where they are sent)"
    await coordinator._send_req(heartbeat)
    assert len(seen) == 1 and before <= seen[0] <= time.monotonic(), "the time the heartbeat was sent"


async def test_the_sync_that_ends_a_rebalance_confirms_membership_before_the_first_heartbeat() -> None:
    """aiokafka heartbeats only a heartbeat interval after Faust's assignment callback returned: until then the sync
    the coordinator accepted is the group's one word that this worker is a member. A refused sync says nothing."""
    coordinator = _Coordinator(27, 0)
    seen: list[float] = []
    watch_group_answers(coordinator, seen.append)
    sync = SyncGroupRequest("group", 4, "member-1", None, [])
    await coordinator._send_req(sync)
    assert seen == [], "a sync refused (a rebalance under way) is no word from the group"
    before = time.monotonic()
    await coordinator._send_req(sync)
    assert len(seen) == 1 and before <= seen[0] <= time.monotonic(), "the time the sync was sent"


def test_a_worker_with_no_word_from_the_group_yet_does_not_trust_its_confirmed_writes() -> None:
    """A table's write confirmed while the group may have expelled the worker makes its partition stale (rebuilt from
    the changelog). Stopped before any word from the group, a worker can not tell how long it was away: its writes
    may have landed after the next owner's, so it trusts none until a commit, heartbeat or sync is accepted."""
    app = faust.App("test-consumer-trust", broker="kafka://127.0.0.1:1")  # never started: no connection
    consumer = WatermarkConsumer(
        app.transport, callback=_ignore, on_partitions_revoked=_ignore, on_partitions_assigned=_ignore,
    )
    runtime = SimpleNamespace(app=SimpleNamespace(consumer=consumer), settings=Settings(session_timeout_s=6.0))
    assert not Runtime.may_be_member(runtime), "no word from the group yet"  # type: ignore[arg-type]
    consumer.confirmed_member(time.monotonic() - 1.0)
    assert Runtime.may_be_member(runtime)  # type: ignore[arg-type]
    consumer.member_at = time.monotonic() - 7.0
    assert not Runtime.may_be_member(runtime), "the last word is older than a session"  # type: ignore[arg-type]


def test_membership_never_goes_back_to_an_older_confirmation() -> None:
    app = faust.App("test-consumer-confirmed", broker="kafka://127.0.0.1:1")  # never started: no connection
    consumer = WatermarkConsumer(
        app.transport, callback=_ignore, on_partitions_revoked=_ignore, on_partitions_assigned=_ignore,
    )
    now = time.monotonic()
    consumer.confirmed_member(now - 1.0)
    consumer.confirmed_member(now - 8.0)  # a commit sent earlier, answered after a heartbeat
    assert consumer.member_at == now - 1.0


def _faust_delivery(batches: list[list[int]], seek_after: int, seek_to: int, rereads: Rereads | None) -> list[int]:
    """Faust's delivery loop as it treats offsets (faust/transport/consumer.py, ``_drain_messages``): a record below
    the partition's read offset is dropped as already read; each delivered record raises it; a seek sets it. The seek
    to ``seek_to`` lands after ``seek_after`` records of the first batch were delivered, the rest of that batch still
    to come; the second batch is what the fetcher reads from the seek on."""
    tp, read_offset, delivered, count = TP("agent.tasks.x", 0), None, [], 0
    for batch in batches:
        for offset in batch:
            if rereads is not None and rereads.passes_over(tp, offset, 0.0):
                continue
            if read_offset is None or offset >= read_offset:
                delivered.append(offset)
                read_offset = offset
            count += 1
            if count == seek_after:
                if rereads is not None:
                    rereads.start(tp, seek_to, 0.0)
                read_offset = seek_to
    return delivered


def test_a_re_read_is_not_overtaken_by_the_batch_fetched_before_its_seek() -> None:
    """Offsets 3 and 4 never arrived; the ledger asks to read again from 3 while 5..9 are being delivered. Unless the
    re-read passes over the rest of that batch, it raises Faust's read offset to 9 and the re-read's 3..8 are dropped
    as read: the gap stays until the next re-read. Passed over, the re-read delivers 3.. in order."""
    first, again = [5, 6, 7, 8, 9], [3, 4, 5, 6, 7, 8, 9, 10]

    without = _faust_delivery([first, again], seek_after=1, seek_to=3, rereads=None)
    assert without == [5, 6, 7, 8, 9, 9, 10], "the bug this guards against: 3 and 4 never delivered"

    rereads = Rereads()
    passed = _faust_delivery([first, again], seek_after=1, seek_to=3, rereads=rereads)
    assert passed == [5, 3, 4, 5, 6, 7, 8, 9, 10]
    assert not rereads, "the record at the start ends the re-read"


def test_a_re_read_passes_over_only_its_partition_and_ends_at_its_start_a_rebalance_or_its_time() -> None:
    a, b = TP("agent.tasks.x", 0), TP("agent.tasks.x", 1)
    rereads = Rereads()
    assert not rereads.passes_over(a, 7, 0.0), "no re-read: nothing passed over"
    rereads.start(a, 3, 0.0)
    assert rereads.passes_over(a, 4, 0.1) and not rereads.passes_over(b, 4, 0.1)
    assert not rereads.passes_over(a, 2, 0.1), "a record before the start is Faust's to drop or deliver"
    assert rereads
    rereads.cancel([a])
    assert not rereads.passes_over(a, 4, 0.1), "a failed seek passes nothing over"
    rereads.start(a, 3, 0.0)
    rereads.start(b, 0, 0.0)
    rereads.clear()
    assert not rereads and not rereads.passes_over(a, 4, 0.1) and not rereads.passes_over(b, 1, 0.1)
    rereads.start(a, 3, 10.0)
    assert rereads.passes_over(a, 9, 10.0 + PASS_OVER_S)
    assert not rereads.passes_over(a, 9, 10.1 + PASS_OVER_S), (
        "its start dropped again: past its time the records are delivered, the ledger sees the gap and reads again")
    assert not rereads


def test_only_a_member_of_a_generation_commits() -> None:
    """aiokafka's generation is -1 while the group does not know this worker (cut off past its session, or leaving):
    a commit then would be taken from outside the group while it has no members, over the offsets its owners
    committed meanwhile."""
    assert in_a_generation(1) and in_a_generation(42)
    assert not in_a_generation(-1)
