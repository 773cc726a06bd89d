from agents_stream.kafka.stall import StallDetector


def test_a_partition_with_waiting_records_and_no_progress_is_reported_after_the_period() -> None:
    d = StallDetector(after_s=10)
    assert not d.observe("t:0", position=0, end=1, now=0)
    assert not d.observe("t:0", position=0, end=1, now=9.9)
    assert d.observe("t:0", position=0, end=1, now=10)
    # reported once, then again only after another full period without progress
    assert not d.observe("t:0", position=0, end=1, now=15)
    assert d.observe("t:0", position=0, end=1, now=20)


def test_progress_restarts_the_clock() -> None:
    d = StallDetector(after_s=10)
    d.observe("t:0", position=0, end=50, now=0)
    assert not d.observe("t:0", position=20, end=50, now=8)
    assert not d.observe("t:0", position=20, end=50, now=17)
    assert d.observe("t:0", position=20, end=50, now=18)


def test_a_caught_up_partition_is_never_reported() -> None:
    d = StallDetector(after_s=1)
    for now in range(10):
        assert not d.observe("t:0", position=5, end=5, now=now)


def test_catching_up_and_falling_behind_again_starts_a_new_period() -> None:
    d = StallDetector(after_s=10)
    d.observe("t:0", position=3, end=4, now=0)
    d.observe("t:0", position=3, end=3, now=5)  # caught up (the record was read)
    assert not d.observe("t:0", position=3, end=4, now=12)
    assert d.observe("t:0", position=3, end=4, now=22)


def test_forget_drops_revoked_partitions() -> None:
    d = StallDetector(after_s=10)
    d.observe("t:0", position=0, end=1, now=0)
    d.forget(["t:0"])
    assert not d.observe("t:0", position=0, end=1, now=10)


def test_only_a_watched_partition_fresh_from_a_rebalance_asks_for_looks_at_every_tick() -> None:
    """A partition the intake paused right after the rebalance stays fresh (never observed), but asks for no look:
    the progress check would otherwise ask the broker for end offsets at every tick while it stays paused."""
    d = StallDetector(after_s=10)
    d.restart_at({"t:0": 3, "t:1": 3}, now=0)
    assert d.fresh(["t:0"]) and d.fresh(["t:1", "t:2"]) and not d.fresh(["t:2"]) and not d.fresh([])
    d.observe("t:0", position=4, end=4, now=1)  # moved: no longer fresh
    assert not d.fresh(["t:0"]) and d.fresh(["t:0", "t:1"])
