"""The console's charts and recent list: each worker's sample ring and recent list, and all workers' merged (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agents_stream.tables.jobs import JobRecord
from agents_stream.tables.leases import TaskRecord

from agents_stream.ops.recent import Recent, RecentJobs, RecentTasks, merge_recent
from agents_stream.ops.samples import Sample, SampleRing, merge, rates


def sample(at: float, ended: float = 0, lag: int = 0, in_flight: int = 0, held: int = 0, **breakers: str) -> Sample:
    return Sample(at=at, ended=ended, lag=lag, in_flight=in_flight, held=held, breakers=dict(breakers))


# -- the sample ring -------------------------------------------------------------------------------------------------


def test_the_ring_keeps_the_history_and_drops_what_is_older() -> None:
    """10 minutes at one sample every 2 s is 301 samples (both ends); the 302nd pushes out the oldest."""
    ring = SampleRing(2.0, 600.0)
    for i in range(400):
        ring.add(sample(1000.0 + 2 * i, ended=i))
    kept = ring.samples()
    assert len(kept) == 301
    assert kept[0].at == 1000.0 + 2 * 99 and kept[-1].at == 1000.0 + 2 * 399
    assert ring.to_json()[-1] == {"at": 1798.0, "ended": 399, "lag": 0, "in_flight": 0, "held": 0, "breakers": {}}


def test_a_clock_stepped_back_starts_the_ring_again() -> None:
    """Samples from before a clock step would read as the future on the chart's time axis."""
    ring = SampleRing(2.0, 600.0)
    ring.add(sample(100.0))
    ring.add(sample(102.0))
    ring.add(sample(50.0))
    assert [s.at for s in ring.samples()] == [50.0]


def test_the_ring_refuses_an_interval_it_cannot_hold() -> None:
    with pytest.raises(ValueError):
        SampleRing(0.0, 600.0)
    with pytest.raises(ValueError):
        SampleRing(10.0, 5.0)


def test_a_sample_survives_the_trip_to_another_worker_and_garbage_does_not_pass() -> None:
    s = sample(12.5, ended=3, lag=4, in_flight=2, held=1, fake="open")
    assert Sample.from_json(json.loads(json.dumps(s.to_json()))) == s
    for bad in ({"at": 1}, {"at": "x", "ended": 0, "lag": 0, "in_flight": 0, "held": 0},
                {"at": 1, "ended": 0, "lag": 0, "in_flight": 0, "held": 0, "breakers": ["open"]}):
        with pytest.raises((KeyError, TypeError, ValueError)):
            Sample.from_json(bad)


def test_throughput_is_the_rate_of_the_ended_counter() -> None:
    """Per second between samples; the first has no interval yet; a counter that went down counts 0."""
    got = rates([sample(0.0, ended=5), sample(2.0, ended=9), sample(4.0, ended=9), sample(6.0, ended=3)])
    assert got == [None, 2.0, 0.0, 0.0]


# -- all workers on one grid ----------------------------------------------------------------------------------------


def test_two_workers_out_of_phase_are_summed_at_each_time() -> None:
    """Worker a samples on the even second, b half a second later: each grid time counts both (their latest
    sample at or before it), so lag, calls in flight, held tasks and throughput are cluster totals."""
    a = [sample(100.0 + 2 * i, ended=10 * i, lag=5, in_flight=1, held=0, fake="closed") for i in range(5)]
    b = [sample(100.5 + 2 * i, ended=4 * i, lag=2, in_flight=3, held=1, fake="closed") for i in range(5)]
    merged = merge([a, b], 2.0, 20.0, now=109.0)
    s = merged["series"]
    assert s["t"] == [90.0 + 2 * k for k in range(10)] + [109.0]
    at = s["t"].index(104.0)
    assert (s["lag"][at], s["in_flight"][at], s["held"][at], s["workers"][at]) == (7, 4, 1, 2)
    assert s["ended_per_s"][at] == 5.0 + 2.0
    assert s["t"][-1] == 109.0 and s["workers"][-1] == 2  # the newest samples show at "now"
    assert s["lag"][:5] == [None] * 5, "before the first sample the line has a gap"
    assert merged["breakers"] == {"fake": [None] * 5 + ["closed"] * 6}


def test_a_worker_that_stopped_sampling_stops_counting() -> None:
    """Its last sample counts for less than two steps, then it no longer adds its lag to the total."""
    a = [sample(100.0 + 2 * i, lag=1) for i in range(10)]
    gone = [sample(100.0, lag=50), sample(102.0, lag=50)]
    s = merge([a, gone], 2.0, 20.0, now=118.0)["series"]
    assert s["lag"][s["t"].index(102.0)] == 51
    assert s["lag"][s["t"].index(104.0)] == 51  # a late tick still counts
    assert s["lag"][s["t"].index(106.0)] == 1
    assert s["workers"][-1] == 1


def test_a_breaker_shows_the_worst_state_any_worker_saw() -> None:
    a = [sample(100.0, p="closed"), sample(102.0, p="half_open")]
    b = [sample(100.5, p="open", q="closed"), sample(102.5, p="closed", q="closed")]
    merged = merge([a, b], 2.0, 6.0, now=103.0)
    breakers = merged["breakers"]
    assert merged["series"]["t"] == [98.0, 100.0, 102.0, 103.0]
    assert breakers["p"] == [None, "closed", "open", "half_open"]
    assert breakers["q"] == [None, None, "closed", "closed"]


def test_no_samples_at_all_is_a_grid_of_gaps() -> None:
    merged = merge([], 2.0, 10.0, now=101.0)
    assert merged["series"]["t"] == [92.0, 94.0, 96.0, 98.0, 100.0, 101.0]
    assert set(merged["series"]["lag"]) == {None} and merged["breakers"] == {}


# -- the recent list ------------------------------------------------------------------------------------------------


def test_the_recent_list_is_bounded_and_newest_first() -> None:
    recent = Recent(3)
    for i in range(5):
        recent.note(f"t{i}", "running", float(i), final=False)
    assert [e["id"] for e in recent.newest(10)] == ["t4", "t3", "t2"]
    assert [e["id"] for e in recent.newest(2)] == ["t4", "t3"]
    assert len(recent) == 3


def test_the_same_state_again_is_no_news_and_a_new_state_is() -> None:
    """A redelivery or heartbeat keeps the time the state was entered; a finish moves the task to the top."""
    recent = Recent(10)
    recent.note("a", "running", 1.0, final=False, dispatch=1)
    recent.note("b", "running", 2.0, final=False, dispatch=1)
    recent.note("a", "running", 3.0, final=False, dispatch=2)
    assert [(e["id"], e["at"], e["dispatch"]) for e in recent.newest(5)] == [("b", 2.0, 1), ("a", 1.0, 2)]
    recent.note("a", "succeeded", 4.0, final=True)
    got = [(e["id"], e["state"], e["at"]) for e in recent.newest(5)]
    assert got == [("a", "succeeded", 4.0), ("b", "running", 2.0)]


def test_moved_partitions_forget_what_could_still_change() -> None:
    """The new owner lists a running task at its next event; a finished one cannot go stale and stays."""
    recent = Recent(10)
    recent.note("running-moved", "running", 1.0, final=False, partition=3)
    recent.note("done-moved", "succeeded", 2.0, final=True, partition=3)
    recent.note("running-kept", "running", 3.0, final=False, partition=4)
    recent.forget({3})
    assert sorted(e["id"] for e in recent.newest(10)) == ["done-moved", "running-kept"]


def record(state: str, **extra: object) -> TaskRecord:
    fields: dict[str, Any] = dict(
        state=state, agent="analyzer", dispatch=1, owner="w1", lease_until=0.0, payload='{"task_id": "t"}',
        topic="agent.tasks.analyzer", partition=2, offset=7, received_at=10.0,
    )
    fields.update(extra)
    return TaskRecord(**fields)


def test_a_task_is_listed_with_its_agent_state_attempts_and_job() -> None:
    tasks = RecentTasks(10)
    tasks.task("t", record("running"), "job-1", now=11.0)
    tasks.task("t", record("succeeded", dispatch=2, finished_at=12.0), None, now=12.5)
    (entry,) = tasks.newest(5)
    assert entry == {"task_id": "t", "state": "succeeded", "at": 12.5, "agent": "analyzer", "dispatch": 2,
                     "partition": 2, "received_at": 10.0, "finished_at": 12.0, "job_id": "job-1"}


def test_a_finished_task_first_seen_here_is_dated_by_its_record() -> None:
    """After a restart a redelivered finished task is seen again: it ended when its record says, not now; its job is
    read from the stored message."""
    tasks = RecentTasks(10)
    payload = json.dumps({"task_id": "t", "job_id": "j9"})
    tasks.task("t", record("failed", finished_at=5.0, payload=payload), None, now=50.0)
    tasks.task("u", record("running", payload="not json"), None, now=51.0)
    assert [(e["task_id"], e["at"], e["job_id"]) for e in tasks.newest(5)] == [("u", 51.0, None), ("t", 5.0, "j9")]


def test_a_job_is_listed_with_its_steps_done() -> None:
    jobs = RecentJobs(10)
    steps = {"a": {"status": "succeeded"}, "b": {"status": "dispatched"}, "c": {"status": "skipped"}}
    jobs.job("j", JobRecord(job_id="j", state="running", created_at=1.0, steps=steps, goal="x" * 300), 5, now=2.0)
    (entry,) = jobs.newest(5)
    assert (entry["job_id"], entry["state"], entry["steps"], entry["steps_done"], entry["partition"]) == (
        "j", "running", 3, 2, 5)
    assert len(entry["goal"]) == 200


def test_every_workers_list_merged_keeps_the_latest_change_of_each_id() -> None:
    """A task whose partition moved is listed by its old owner (running) and its new one (succeeded): the later
    wins; malformed entries from another version are left out; newest first, at most ``limit``."""
    old_owner = [{"task_id": "t1", "state": "running", "at": 5.0}, {"task_id": "t2", "state": "succeeded", "at": 4.0}]
    new_owner = [{"task_id": "t1", "state": "succeeded", "at": 9.0}, {"task_id": "t3", "state": "failed", "at": 7.0},
                 {"task_id": 12, "at": 99.0}, {"task_id": "t4", "at": "late"}, "garbage"]
    merged = merge_recent([old_owner, new_owner], "task_id", 10)
    assert [(e["task_id"], e["state"]) for e in merged] == [("t1", "succeeded"), ("t3", "failed"), ("t2", "succeeded")]
    assert [e["task_id"] for e in merge_recent([old_owner, new_owner], "task_id", 2)] == ["t1", "t3"]
