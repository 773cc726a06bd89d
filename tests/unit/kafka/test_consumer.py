"""Pausing intake must not drop the batch Faust is delivering (agents_stream.kafka.consumer.WatermarkConsumer)."""

from __future__ import annotations

import time

import faust
from aiokafka.protocol.group import HeartbeatRequest
from faust.types import TP

from agents_stream.kafka.consumer import WatermarkConsumer, commit_again, watch_heartbeats


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
    """aiokafka's group coordinator as far as watch_heartbeats sees it: one request method, answers given in order."""

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
    watch_heartbeats(coordinator, seen.append)
    heartbeat = HeartbeatRequest("group", 3, "member-1")
    before = time.monotonic()
    for _ in range(3):
        await coordinator._send_req(heartbeat)
    assert seen == [], "a refused heartbeat is no word from the group"
    await coordinator._send_req(object())  # any other request the coordinator sends
    assert seen == [], "only heartbeats are read here (accepted commits are counted where they are sent)"
    await coordinator._send_req(heartbeat)
    assert len(seen) == 1 and before <= seen[0] <= time.monotonic(), "the time the heartbeat was sent"


def test_membership_never_goes_back_to_an_older_confirmation() -> None:
    app = faust.App("test-consumer-confirmed", broker="kafka://127.0.0.1:1")  # never started: no connection
    consumer = WatermarkConsumer(
        app.transport, callback=_ignore, on_partitions_revoked=_ignore, on_partitions_assigned=_ignore,
    )
    now = time.monotonic()
    consumer.confirmed_member(now - 1.0)
    consumer.confirmed_member(now - 8.0)  # a commit sent earlier, answered after a heartbeat
    assert consumer.member_at == now - 1.0
