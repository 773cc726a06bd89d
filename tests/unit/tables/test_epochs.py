"""Owner epochs (tables/epochs.py): a record a former owner writes after the partition moved is never applied."""

from __future__ import annotations

from agents_stream.tables.epochs import HEADER, EpochFilter, epoch_in, header, next_epoch


def test_a_late_record_of_a_former_owner_is_skipped_and_the_new_owners_are_kept() -> None:
    """The log of one partition as a later recovery reads it: W1 (epoch 3) wrote, W2 took over (epoch 4) and wrote,
    then W1's batch, held while it was cut off, landed."""
    log = [("w1 record", 3), ("w2 epoch record", 4), ("w2 record", 4), ("w1 late record", 3), ("w2 record 2", 4)]
    f = EpochFilter()
    f.start(0, 0)
    applied = [what for what, epoch in log if f.keep(0, epoch)]
    assert applied == ["w1 record", "w2 epoch record", "w2 record", "w2 record 2"]


def test_records_without_an_epoch_are_applied_as_before() -> None:
    f = EpochFilter()
    f.start(0, 5)
    assert f.keep(0, None) and not f.keep(0, 4) and f.keep(0, 5) and f.keep(0, 6) and not f.keep(0, 5)


def test_partitions_are_fenced_each_on_its_own() -> None:
    f = EpochFilter()
    assert f.keep(1, 7) and f.keep(2, 1) and not f.keep(1, 6)


def test_the_stored_epoch_counts_before_anything_is_read() -> None:
    f = EpochFilter()
    assert not f.known(3)
    f.start(3, 9)
    assert f.known(3) and not f.keep(3, 8)


def test_a_new_owner_takes_one_more_than_the_stored_epoch() -> None:
    assert next_epoch(None) == 1 and next_epoch({"epoch": 4}) == 5 and next_epoch({"epoch": "x"}) == 1


def test_the_header_round_trips_and_odd_values_count_as_none() -> None:
    assert epoch_in([header(12)]) == 12
    assert epoch_in([("other", b"1"), (HEADER, b"x")]) is None
    assert epoch_in(None) is None and epoch_in([]) is None
