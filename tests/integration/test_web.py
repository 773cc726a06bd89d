"""Web reads on the real broker: any worker answers for any key, routed to the key's owner."""

from __future__ import annotations

from urllib.parse import quote

from agents_stream import topics

from .harness import encode, produce, results_for, task, unique


async def test_any_worker_answers_for_any_task(cluster_factory):
    """With two workers, /tasks/<id> gives the record from either one (Faust's table_route hashes the JSON-encoded
    key and sent about half of these to a worker without the key); unknown ids are 404 on both."""
    agent = unique("web")
    c = cluster_factory([agent], None)
    workers = [await c.started("w0"), await c.started("w1")]
    ids = [f"job{i}/step" for i in range(8)] + [f"plain-{i}" for i in range(8)]
    await produce(topics.task_topic(agent), [encode(task(agent, i)) for i in ids])
    await results_for(set(ids), timeout=60)
    owners = set()
    for task_id in ids:
        for w in workers:
            body = await w.get(f"/tasks/{quote(task_id, safe='')}")
            assert isinstance(body, dict) and body.get("task_id") == task_id and body["state"] == "succeeded", (w.name, task_id, body)
            owners.add(body["owner"])
    assert len(owners) == 2, "both workers own some of the tasks, so half the reads were forwarded"
    for w in workers:
        body = await w.get("/tasks/no-such-task")
        assert body == {"error": "unknown task_id 'no-such-task'"}
