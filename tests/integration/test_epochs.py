"""Owner epochs on the real broker: a record a former owner of a table partition writes after the partition moved
(its batch held while it was cut off or paused) is never read as current by a later recovery."""

from __future__ import annotations

import json
from urllib.parse import quote

from agents_stream.contract import topics

from .harness import PARTITIONS, encode, produce, results_for, task, unique


def _forged(task_id: str, agent: str, partition: int) -> bytes:
    """A task record as a former owner would have left it: running, leased to a worker that no longer exists."""
    body = {"state": "running", "agent": agent, "dispatch": 1, "owner": "zombie:1:dead", "lease_until": 9e9,
            "payload": json.dumps(task(agent, task_id)), "topic": topics.task_topic(agent), "partition": partition,
            "offset": 0, "received_at": 1.0, "v": 1}
    return json.dumps(body).encode()


async def test_a_former_owners_late_changelog_record_is_skipped_by_every_later_recovery(cluster_factory):
    agent = unique("analyzer")
    c = cluster_factory([agent], None)
    w0 = await c.started()
    done = task(agent)
    await produce(topics.task_topic(agent), [encode(done)])
    got = await results_for({done["task_id"]}, timeout=60)
    assert [json.loads(m.value)["status"] for m in got[done["task_id"]]] == ["succeeded"]

    # Two records land on the tasks table's changelog after w0 took the partition over (epoch >= 1): the finished
    # task's record overwritten by a former owner (epoch 0), and a record of another task by a newer owner.
    partition = topics.partition_for(done["task_id"].encode(), PARTITIONS)
    newer = unique("newer")
    while topics.partition_for(newer.encode(), PARTITIONS) != partition:
        newer = unique("newer")
    changelog = f"{c.app_id}-tasks-changelog"
    await produce(changelog, [(json.dumps(done["task_id"]).encode(), _forged(done["task_id"], agent, partition))],
                  partition=partition, headers=[("agents_stream.epoch", b"0")])
    await produce(changelog, [(json.dumps(newer).encode(), _forged(newer, agent, partition))],
                  partition=partition, headers=[("agents_stream.epoch", b"1000")])
    code, _ = w0.terminate()
    assert code == 0

    w1 = await c.started("w1")  # a data dir of its own: every table partition recovered from the changelog
    kept = await w1.get(f"/tasks/{quote(done['task_id'], safe='')}")
    assert kept.get("state") == "succeeded", f"the former owner's record was read as current: {kept}"
    applied = await w1.get(f"/tasks/{quote(newer, safe='')}")
    assert applied.get("owner") == "zombie:1:dead", "a newer owner's record is applied (the test can see one)"
    assert "were skipped" in w1.tail(400), "the recovery says it skipped a former owner's record"

    again = await c.started("w0")  # w0 again, on its own data dir: it reads only what landed after it stopped
    kept = await again.get(f"/tasks/{quote(done['task_id'], safe='')}")
    assert kept.get("state") == "succeeded"
