"""The refund saga (label → refund (pivot) → notify → update order) on the real broker against fake services."""

from __future__ import annotations

import json

from agents_stream.contract import topics
from agents_stream.examples.services import FakeServices

from .harness import encode, eventually, produce, read_topic, results_for, task, unique


def saga_toml(agent: str) -> str:
    return (
        f'[providers.local]\nkind = "local"\n\n[agents.{agent}]\nproviders = ["local"]\n'
        'saga = "agents_stream.examples.refund:REFUND"\n'
    )


def order(agent: str) -> dict:
    return task(agent, instruction="refund order",
                context_data={"order_id": unique("o"), "amount": 42.5, "email": "a@example.com"})


async def test_refund_saga_compensates_before_the_pivot_and_retries_after_it(cluster_factory):
    """Refund fails → the label is cancelled (newest first), nothing else runs; notify fails twice → retried with the
    same key until it completes; no key has an effect twice (the services' call logs)."""
    async with FakeServices() as services:
        agent = unique("support")
        c = cluster_factory([agent], None, toml=saga_toml(agent), AGENTS_STREAM_REFUND_SERVICES=services.url)
        await c.started()

        services.fail("payment.refund", times=1)
        undone = order(agent)
        await produce(topics.task_topic(agent), [encode(undone)])
        r1 = json.loads((await results_for({undone["task_id"]}, timeout=60))[undone["task_id"]][0].value)
        mine = [x for x in services.calls if x.key.startswith(undone["task_id"])]
        assert r1["status"] == "failed" and "failed before its pivot" in r1["error"]
        assert [(x.operation, x.failed) for x in mine] == [("carrier.label", False), ("payment.refund", True),
                                                           ("carrier.cancel_label", False)]

        services.fail("mail.send", times=2)
        done = order(agent)
        await produce(topics.task_topic(agent), [encode(done)])
        r2 = json.loads((await results_for({done["task_id"]}, timeout=60))[done["task_id"]][0].value)
        mine = [x for x in services.calls if x.key.startswith(done["task_id"])]
        assert r2["status"] == "succeeded" and set(r2["output"]) == {"label", "refund", "notify", "update_order"}
        assert [x.operation for x in mine] == ["carrier.label", "payment.refund", "mail.send", "mail.send", "mail.send",
                                               "orders.update"]
        assert len({x.key for x in mine if x.operation == "mail.send"}) == 1, "one idempotency key across the retries"
        assert not [x for x in mine if x.operation == "carrier.cancel_label"], "nothing is undone after the pivot"
        for op in ("carrier.label", "payment.refund", "mail.send", "orders.update", "carrier.cancel_label"):
            keys = services.executed(op)
            assert len(keys) == len(set(keys)), f"{op}: a key had an effect twice"
        controls = await read_topic(
            topics.CONTROL, timeout=20,
            until=lambda s: any(json.loads(m.value)["event"] == "saga.completed" for m in s),
            keep=lambda m: (m.key in (undone["task_id"].encode(), done["task_id"].encode())
                            and json.loads(m.value)["event"].startswith("saga.")),
        )
    events = [(m.key.decode() == done["task_id"], json.loads(m.value)["event"]) for m in controls]
    assert (False, "saga.compensating") in events and (False, "saga.compensated") in events
    assert (True, "saga.pivoted") in events and (True, "saga.retrying") in events and (True, "saga.completed") in events
    print(f"\nsaga: compensated run {[(x.operation) for x in services.calls if x.key.startswith(undone['task_id'])]}; "
          f"completed run with 2 notify retries on one key")


async def test_refund_saga_survives_a_worker_kill_after_the_pivot(cluster_factory):
    """SIGKILL while `notify` is in flight (after the pivot): the next worker replays the checkpointed reports, so
    label and refund are not called again, notify is repeated with its key (no second effect), and the saga
    completes."""
    async with FakeServices() as services:
        agent = unique("support")
        c = cluster_factory([agent], None, toml=saga_toml(agent), AGENTS_STREAM_REFUND_SERVICES=services.url)
        first = await c.started("w0")
        services.delay("mail.send", 30.0)
        t = order(agent)
        await produce(topics.task_topic(agent), [encode(t)])
        await eventually(lambda: services.executed("mail.send"), timeout=60, what="notify in flight")
        first.kill()
        services.delay("mail.send", 0.0)
        await c.started("w1")
        r = json.loads((await results_for({t["task_id"]}, timeout=90))[t["task_id"]][0].value)
        assert r["status"] == "succeeded" and set(r["output"]) == {"label", "refund", "notify", "update_order"}
        mine = [(x.operation, x.replay) for x in services.calls if x.key.startswith(t["task_id"])]
        assert mine == [
            ("carrier.label", False), ("payment.refund", False), ("mail.send", False), ("mail.send", True),
            ("orders.update", False),
        ], mine
    print(f"\nsaga kill: calls after a SIGKILL during notify {mine}")
