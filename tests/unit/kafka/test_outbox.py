"""The outbox's public sends (agents_stream.kafka.outbox), without a broker: what goes on the wire, and its tasks."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiokafka.errors import MessageSizeTooLargeError
from faust.types import TP

from agents_stream.contract import topics
from agents_stream.kafka.outbox import Outbox
from agents_stream.kafka.watermark import Watermark

SOURCE = TP("agent.tasks.a", 2)


class Producer:
    """Records every send as (topic, key, value, partition, headers, future); the test answers the futures."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None, int | None, Any, asyncio.Future]] = []

    def channel(self, topic: str) -> Any:
        producer = self

        class Channel:
            def send_soon(self, *, key: bytes | None, value: bytes | None, partition: int | None = None,
                          headers: Any = None) -> asyncio.Future:
                fut = asyncio.get_running_loop().create_future()
                producer.sent.append((topic, key, value, partition, headers, fut))
                return fut

        return Channel()


async def _no_lookup(dlq: str, source: tuple[str, int, int], since: float) -> None:
    raise AssertionError("no look on the dead-letter topic expected")


def _outbox(producer: Producer, **kwargs: Any) -> Outbox:
    return Outbox(producer.channel, Watermark(), "w", find_dead_letter=_no_lookup, **kwargs)


async def test_a_dead_letter_carries_the_contract_headers_and_the_original_bytes():
    """The dead-letter headers (docs/contract.md), then the extra ones; key and value byte for byte; its DLQ."""
    producer = Producer()
    outbox = _outbox(producer)
    send = outbox.dead_letter(
        SOURCE, 41, b"t1", b"\xff raw", agent="a", reason="not_json", layer="schema", attempts=1,
        headers=[("agents_stream.history", b"[]")],
    )
    send()
    topic, key, value, _, headers, _ = producer.sent[0]
    assert (topic, key, value) == (topics.dlq_topic("a"), b"t1", b"\xff raw")
    names = [name for name, _ in headers]
    assert names == [
        "error_reason", "error_layer", "original_topic", "original_partition", "original_offset", "failed_at",
        "attempts", "agents_stream.history",
    ]
    got = dict(headers)
    assert got["original_topic"] == b"agent.tasks.a" and got["original_partition"] == b"2"
    assert got["original_offset"] == b"41" and got["attempts"] == b"1" and got["error_layer"] == b"schema"


async def test_a_changelog_retry_sends_the_keys_current_value():
    """The first attempt is the table's own send; a retry re-sends what the table holds now (compacted: idempotent)."""
    loop = asyncio.get_running_loop()
    first = loop.create_future()
    resent: list[tuple[int, str, Any]] = []

    class Table(dict):
        last_changelog = first

        def send_changelog(self, partition: int, key: str, value: Any) -> asyncio.Future:
            resent.append((partition, key, value))
            return loop.create_future()

    table = Table(k="v2")
    send = _outbox(Producer()).changelog(table, 3, "k")
    assert send() is first and resent == []
    send()
    assert resent == [(3, "k", "v2")]


async def test_control_events_hold_no_offset():
    """A control event is best effort: it goes to agent.control keyed by its subject and holds nothing."""
    producer = Producer()
    outbox = _outbox(producer)
    outbox.control("task.held", "t1", "a", {"why": "x"})
    topic, key, value, _, _, fut = producer.sent[0]
    assert (topic, key) == (topics.CONTROL, b"t1")
    body = json.loads(value or b"{}")
    assert body["event"] == "task.held" and body["worker"] == "w" and body["details"] == {"why": "x"}
    assert outbox.delivering() == 0 and outbox.watermark.open_count() == 0
    fut.set_exception(ConnectionError("lost"))  # only logged
    await asyncio.sleep(0)


async def test_stopping_cancels_the_retry_tasks_and_keeps_their_offsets_held():
    """A delivery being retried at stop is cancelled (the outbox owns the task); its offset is never released."""
    producer = Producer()
    outbox = _outbox(producer, retry_delay=lambda attempt: 60.0)
    outbox.watermark.handled(SOURCE, 7)
    outbox.deliver(SOURCE, 7, [outbox.record("agent.results", b"t1", b"{}")])
    producer.sent[0][-1].set_exception(ConnectionError("down"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert outbox.delivering() == 1, "handed to a retry task"
    await outbox.stop()
    assert outbox.delivering() == 0
    assert outbox.watermark.commit_offset(SOURCE) == 7


async def test_a_record_too_large_for_the_broker_is_not_retried_and_releases_its_offset():
    """A send the broker refuses as too large (MessageSizeTooLarge) is never retried: the delivery gives up at
    once, releases the offset (the partition commits past it) and alerts, instead of holding it forever."""
    producer = Producer()
    outbox = _outbox(producer, retry_delay=lambda attempt: 0.0)
    outbox.watermark.handled(SOURCE, 7)
    outbox.deliver(SOURCE, 7, [outbox.record("agent.results", b"t1", b"{}")])
    producer.sent[0][-1].set_exception(MessageSizeTooLargeError("too big"))
    for _ in range(50):
        await asyncio.sleep(0)
        if outbox.delivering() == 0:
            break
    results = [s for s in producer.sent if s[0] == "agent.results"]
    alerts = [json.loads(s[2])["event"] for s in producer.sent if s[0] == topics.CONTROL]
    assert len(results) == 1, "sent once, never again"
    assert outbox.delivering() == 0 and outbox.watermark.commit_offset(SOURCE) == 8
    assert alerts == ["alert.record_too_large"]
    await outbox.stop()
