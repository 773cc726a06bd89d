"""A new app id on a task topic another app id has read does not call the model again for its history until the
operator says where to start (AGENTS_STREAM_START_FROM); a topic nobody has read is read from the start."""

from __future__ import annotations

from collections import Counter

from agents_stream.contract import topics

from .harness import committed, create_topics, encode, end_offsets, eventually, produce, results_for, task, unique


def calls(fake_llm, ids: list[str]) -> list[int]:
    """How many times the model was called for each of ``ids``, in order."""
    seen = Counter(r.task_id for r in fake_llm.requests)
    return [seen[i] for i in ids]


async def stopped(worker, timeout: float = 90.0) -> int:
    """The exit code of a worker that stops by itself."""
    await eventually(lambda: worker.proc.poll() is not None, timeout=timeout, what=f"worker {worker.name} to exit")
    return worker.proc.returncode


async def test_a_second_app_id_reads_another_ones_topic_only_from_where_the_operator_chose(
    cluster_factory, fake_llm,
):
    # Worker names differ: the clusters share the test's directory, and each worker its data dir.
    """First app: reads a fresh topic from the start. Second app: refuses without a choice (no model call), then
    with ``latest`` answers only new tasks. Third: ``group:<first>`` starts at the first app's commits. Fourth:
    ``earliest`` calls the model again for everything, as it says."""
    agent = unique("history")
    topic = topics.task_topic(agent)
    await create_topics([topic])
    old = [task(agent, n=i) for i in range(3)]
    await produce(topic, [encode(t) for t in old])  # before any worker: nothing may be lost

    first = cluster_factory([agent], fake_llm.url)
    w = await first.started("first")
    await results_for({t["task_id"] for t in old}, timeout=90)
    await eventually(lambda: _all_committed(first.app_id, topic), timeout=30, what="the first app's commits")
    w.terminate()
    ids = [t["task_id"] for t in old]
    assert calls(fake_llm, ids) == [1, 1, 1]

    missed = task(agent, n=3)  # published while no worker runs: the first app's commits stop before it
    await produce(topic, [encode(missed)])
    ids.append(missed["task_id"])

    second = cluster_factory([agent], fake_llm.url)
    refusing = second.worker("refused").start()
    assert await stopped(refusing) != 0
    log = refusing.tail(200)
    assert f"App id {second.app_id} has never read {topic} (read by {first.app_id})" in log
    assert "AGENTS_STREAM_START_FROM=earliest" in log and f"=group:{first.app_id}" in log
    assert calls(fake_llm, ids) == [1, 1, 1, 0]
    assert await committed(second.app_id, topic) == {}

    w = await second.started("second", AGENTS_STREAM_START_FROM="latest")
    new = task(agent, n=4)
    await produce(topic, [encode(new)])
    await results_for({new["task_id"]}, timeout=90)
    ids.append(new["task_id"])
    await eventually(lambda: _all_committed(second.app_id, topic), timeout=30, what="the second app's commits")
    assert calls(fake_llm, ids) == [1, 1, 1, 0, 1]
    w.terminate()

    third = cluster_factory([agent], fake_llm.url, AGENTS_STREAM_START_FROM=f"group:{first.app_id}")
    w = await third.started("third")
    await eventually(lambda: calls(fake_llm, ids) == [1, 1, 1, 1, 2], timeout=90, what="the tasks after the first "
                     f"app's commits, once more; calls so far {calls(fake_llm, ids)}")
    await eventually(lambda: _all_committed(third.app_id, topic), timeout=30, what="the third app's commits")
    w.terminate()

    fourth = cluster_factory([agent], fake_llm.url, AGENTS_STREAM_START_FROM="earliest")
    await fourth.started("fourth")
    await eventually(lambda: calls(fake_llm, ids) == [2, 2, 2, 2, 3], timeout=90, what="every task once more; "
                     f"calls so far {calls(fake_llm, ids)}")
    await eventually(lambda: _all_committed(fourth.app_id, topic), timeout=30, what="the fourth app's commits")


async def _all_committed(group: str, topic: str) -> bool:
    ends, done = await end_offsets(topic), await committed(group, topic)
    return all(done.get(p, 0) == end for p, end in ends.items())
