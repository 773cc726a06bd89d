"""Watermark: the offset the consumer may commit, never past work that is not durable."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agents_stream.kafka.watermark import Watermark

TP = ("agent.tasks.analyzer", 0)
TP2 = ("agent.tasks.analyzer", 1)


def test_unknown_partition_has_no_commit() -> None:
    """A partition the ledger has not seen gives no offset to commit (never a guessed 0)."""
    wm = Watermark()
    assert wm.commit_offset(TP) is None
    assert wm.open_count() == 0
    assert wm.tracked() == set()


def test_commit_is_next_offset_after_handled() -> None:
    """With nothing open the commit is Kafka's 'next to read': the last handled offset + 1."""
    wm = Watermark()
    for offset in range(5):
        wm.handled(TP, offset)
        assert wm.commit_offset(TP) == offset + 1


def test_commit_never_passes_an_open_offset() -> None:
    """A held offset stops the commit there, however far the ledger has handled."""
    wm = Watermark()
    wm.open(TP, 3)
    for offset in range(10):
        wm.handled(TP, offset)
    assert wm.commit_offset(TP) == 3
    wm.close(TP, 3, 0)
    assert wm.commit_offset(TP) == 10


def test_commit_stops_at_lowest_open_offset() -> None:
    """With several held offsets the commit stops at the lowest, and advances as they close."""
    wm = Watermark()
    for offset in range(10):
        if offset in (2, 5, 8):
            wm.open(TP, offset)
        wm.handled(TP, offset)
    assert wm.commit_offset(TP) == 2
    wm.close(TP, 5, 0)
    assert wm.commit_offset(TP) == 2
    wm.close(TP, 2, 0)
    assert wm.commit_offset(TP) == 8
    wm.close(TP, 8, 0)
    assert wm.commit_offset(TP) == 10


def test_holds_are_counted() -> None:
    """An offset opened twice (task + pending send) stays held until closed twice."""
    wm = Watermark()
    wm.open(TP, 4)
    wm.open(TP, 4)
    wm.handled(TP, 4)
    assert wm.open_count(TP) == 2
    wm.close(TP, 4, 0)
    assert wm.commit_offset(TP) == 4
    assert wm.open_count(TP) == 1
    wm.close(TP, 4, 0)
    assert wm.commit_offset(TP) == 5
    assert wm.open_count(TP) == 0


def test_close_of_unknown_offset_is_a_noop() -> None:
    """Closing something never opened (or already closed) neither raises nor releases another hold."""
    wm = Watermark()
    wm.open(TP, 2)
    wm.handled(TP, 6)
    wm.close(TP, 3, 0)
    wm.close(TP2, 2, 0)
    assert wm.commit_offset(TP) == 2
    wm.close(TP, 2, 0)
    wm.close(TP, 2, 0)  # extra close: must not go negative and swallow a later open
    wm.open(TP, 2)
    assert wm.commit_offset(TP) == 2
    assert wm.open_count(TP) == 1


def test_close_after_revocation_is_a_noop() -> None:
    """A send confirmed after its partition was revoked releases nothing of the next assignment."""
    wm = Watermark()
    wm.open(TP, 5)
    wm.handled(TP, 5)
    wm.forget([TP])
    wm.close(TP, 5, 0)
    assert wm.commit_offset(TP) is None
    assert wm.open_count() == 0


def test_a_hold_from_before_a_revoke_does_not_release_one_taken_after_the_partition_came_back() -> None:
    """A delivery started before a revoke and confirmed after the same partition came back to this worker
    must not release the hold its redelivery took: nothing past that offset may be committed before it is durable."""
    wm = Watermark()
    before = wm.open(TP, 5)
    wm.handled(TP, 5)
    wm.forget([TP])  # revoked, then assigned again
    wm.start(TP, 5)
    after = wm.open(TP, 5)  # the redelivery holds it again (a running task's Track, a new send)
    wm.handled(TP, 5)
    wm.handled(TP, 6)
    wm.close(TP, 5, before)  # the old delivery is confirmed now
    assert wm.commit_offset(TP) == 5, "still held by the redelivery"
    wm.close(TP, 5, after)
    assert wm.commit_offset(TP) == 7


def test_forget_drops_only_the_revoked_partitions() -> None:
    """Revoked partitions lose their holds and position; the others keep theirs."""
    wm = Watermark()
    wm.open(TP, 1)
    wm.handled(TP, 3)
    wm.open(TP2, 7)
    wm.handled(TP2, 9)
    wm.forget([TP])
    assert wm.commit_offset(TP) is None
    assert wm.open_count(TP) == 0
    assert wm.tracked() == {TP2}
    assert wm.commit_offset(TP2) == 7
    assert wm.open_count() == 1


def test_partitions_are_independent() -> None:
    """A hold on one partition does not hold back another."""
    wm = Watermark()
    wm.open(TP, 0)
    wm.handled(TP, 0)
    wm.handled(TP2, 41)
    assert wm.commit_offset(TP) == 0
    assert wm.commit_offset(TP2) == 42
    assert wm.open_count() == 1
    assert wm.tracked() == {TP, TP2}


def test_handled_out_of_order_never_moves_backwards() -> None:
    """An older offset handled late (a replay) does not pull the commit back."""
    wm = Watermark()
    wm.handled(TP, 9)
    wm.handled(TP, 4)
    assert wm.commit_offset(TP) == 10
    wm.handled(TP, 9)
    assert wm.commit_offset(TP) == 10


def test_offset_zero_is_committable() -> None:
    """Holding offset 0 commits 0 (nothing), not None and not 1."""
    wm = Watermark()
    wm.open(TP, 0)
    wm.handled(TP, 0)
    assert wm.commit_offset(TP) == 0


# Each step: open the message being handled (k times), then mark it handled, and/or close
# a random earlier hold — the order the ledger uses (open before handled, closes later).
steps = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=2),  # holds opened on this message
        st.lists(st.integers(min_value=0, max_value=10_000), max_size=3),  # picks of holds to close
        st.integers(min_value=0, max_value=3),  # holds re-opened on an earlier offset
    ),
    max_size=60,
)


@settings(max_examples=300)
@given(steps=steps)
def test_commit_never_passes_open_or_unhandled(steps: list[tuple[int, list[int], int]]) -> None:
    """For any interleaving of handled/open/close the commit never passes the lowest open offset
    or the last handled + 1."""
    wm = Watermark()
    holds: list[int] = []  # a multiset of open offsets, the model
    for offset, (opens, closes, reopen) in enumerate(steps):
        for _ in range(opens):
            wm.open(TP, offset)
            holds.append(offset)
        if reopen and offset:
            earlier = reopen % offset
            wm.open(TP, earlier)
            holds.append(earlier)
        wm.handled(TP, offset)
        for pick in closes:
            if holds:
                wm.close(TP, holds.pop(pick % len(holds)), 0)
        commit = wm.commit_offset(TP)
        assert commit is not None
        assert commit <= offset + 1
        if holds:
            assert commit == min(holds)
        else:
            assert commit == offset + 1
        assert wm.open_count(TP) == len(holds)


def test_a_gap_in_handled_offsets_is_never_committed_past() -> None:
    """If the consumer skips records, the commit stays at the first skipped offset until they are read again."""
    w = Watermark()
    assert w.handled("tp", 10) is None  # with no start given, the first offset seen sets it
    assert w.handled("tp", 11) is None
    assert w.handled("tp", 15) == 12, "12..14 never arrived"
    assert w.commit_offset("tp") == 12
    assert w.handled("tp", 16) == 12, "still a gap: nothing past what was never seen"
    assert w.commit_offset("tp") == 12
    for offset in range(12, 17):  # read again from 12 (the caller seeks back)
        assert w.handled("tp", offset) is None
    assert w.commit_offset("tp") == 17


def test_records_dropped_right_after_assignment_are_a_gap() -> None:
    """Reading starts at the group's commit: a first record past it means the ones before it were dropped
    (the lost tasks of the SIGKILL benchmark: the new owner committed past records it never saw)."""
    w = Watermark()
    w.start("tp", 40)
    assert w.commit_offset("tp") == 40
    assert w.handled("tp", 52) == 40
    assert w.commit_offset("tp") == 40
    assert w.handled("tp", 40) is None and w.commit_offset("tp") == 41


def test_start_does_not_move_a_partition_already_read() -> None:
    w = Watermark()
    w.handled("tp", 7)
    w.start("tp", 3)
    assert w.commit_offset("tp") == 8


def test_records_deleted_by_retention_are_skipped_not_waited_for() -> None:
    w = Watermark()
    w.start("tp", 5)
    assert w.handled("tp", 30) == 5
    w.skip_to("tp", 30)
    assert w.handled("tp", 30) is None and w.commit_offset("tp") == 31
    w.skip_to("tp", 10)  # never backwards
    assert w.commit_offset("tp") == 31
