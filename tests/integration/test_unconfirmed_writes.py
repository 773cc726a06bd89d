"""Only confirmed table writes survive a restart.

A worker writes a task's finished record to its local RocksDB store before the broker confirms the record's
changelog send. Killed in between and restarted on the same data dir, it must not answer from that record: the
changelog never got it, so a later owner, recovering the table from the changelog, would run the task again and
send a second, different result. The test fault ``AGENTS_STREAM_FAULT_UNANSWERED_CHANGELOG`` holds every finished
record's changelog send of the first worker unanswered; it is killed, restarted on its data dir, and then another
worker (a fresh data dir: the changelog alone) takes over and gets each task again (a producer's retry). Every task
has one distinct result, and the model ran each task at most twice (the killed run and one after)."""

from __future__ import annotations

from urllib.parse import quote

from agents_stream.tables.writes import FAULT_UNANSWERED_CHANGELOG

from agents_stream.contract import topics

from .harness import create_topics, encode, eventually, produce, read_topic, task, unique


async def test_a_restart_on_its_data_dir_never_answers_from_a_record_the_changelog_never_got(
    cluster_factory, fake_llm,
):
    agent = unique("unconfirmed")
    task_topic = topics.task_topic(agent)
    await create_topics([task_topic])
    c = cluster_factory([agent], fake_llm.url)
    w0 = await c.started("w0", **{FAULT_UNANSWERED_CHANGELOG: 'tasks="state":"succeeded"'})
    batch = [task(agent, n=i) for i in range(4)]
    ids = {t["task_id"] for t in batch}
    await produce(task_topic, [encode(t) for t in batch])
    await eventually(lambda: _all_in(w0, ids, "succeeded"), timeout=60, what="every task finished on w0, unconfirmed")
    assert "is never sent" in w0.tail(400), "the test fault held the finished records' changelog sends"
    w0.kill()

    again = await c.started("w0")  # the same data dir, without the fault
    first = await _results(ids, each=1, timeout=60)
    again.terminate()

    w1 = await c.started("w1")  # a fresh data dir: the changelog alone
    await produce(task_topic, [encode(t) for t in batch])  # the producer sends every task again
    both = await _results(ids, each=2, timeout=60)
    assert all(len(values) >= 2 for values in both.values()), f"each task answered again: {both}"
    distinct = {task_id: set(values) for task_id, values in both.items()}
    assert all(len(values) == 1 for values in distinct.values()), (
        "one result per task: the retry is answered from a record the changelog has, not run again"
    )
    assert all(set(first[task_id]) == distinct[task_id] for task_id in ids), "the answer the restart sent"
    assert len(fake_llm.requests) <= 2 * len(ids), "each task ran at most twice: the killed run and one after"
    assert (await w1.get(f"/tasks/{quote(batch[0]['task_id'], safe='')}"))["state"] == "succeeded"
    assert "never confirmed" in again.tail(2000), "the restarted worker discarded what the changelog never got"


async def _all_in(worker, ids: set[str], state: str) -> bool:
    for task_id in ids:
        body = await worker.get(f"/tasks/{quote(task_id, safe='')}")
        if not (isinstance(body, dict) and body.get("state") == state):
            return False
    return True


async def _results(ids: set[str], *, each: int, timeout: float) -> dict[str, list[bytes]]:
    """The values of agent.results for ``ids``, once each has ``each`` of them (or the timeout passed)."""
    def enough(seen: list) -> bool:
        counts: dict[str, int] = {}
        for m in seen:
            counts[m.key.decode()] = counts.get(m.key.decode(), 0) + 1
        return all(counts.get(task_id, 0) >= each for task_id in ids)

    msgs = await read_topic(
        topics.RESULTS, timeout=timeout, until=enough, keep=lambda m: m.key is not None and m.key.decode() in ids,
    )
    out: dict[str, list[bytes]] = {task_id: [] for task_id in ids}
    for m in msgs:
        out[m.key.decode()].append(m.value)
    return out
