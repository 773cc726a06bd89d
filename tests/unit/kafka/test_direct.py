"""Direct sends (agents_stream.kafka.direct): records keep their order, a send that must wait finishes in a task, a
refused record fails its own future, and stopping fails what was still queued. The producer here is a fake with
aiokafka's ``send`` contract: a coroutine that appends the record and returns the future of its confirmation,
waiting first when the topic's metadata is unknown."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError

from agents_stream.kafka import direct as direct_module
from agents_stream.kafka.delivery import RecordTooLarge
from agents_stream.kafka.direct import DirectSends


class FakeProducer:
    """Appends records in the order its ``send`` coroutines reach their append; the broker's answers are futures
    the test settles. A topic in ``unknown`` waits for ``metadata`` first; a value over ``max_size`` is refused."""

    def __init__(self) -> None:
        self.appended: list[tuple[str, bytes | None]] = []
        self.answers: list[asyncio.Future[Any]] = []
        self.unknown: set[str] = set()
        self.metadata = asyncio.Event()
        self.max_size = 100

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int | None = None,
                   headers: Any = None) -> asyncio.Future[Any]:
        if topic in self.unknown:
            await self.metadata.wait()
            self.unknown.discard(topic)
        if value is not None and len(value) > self.max_size:
            raise MessageSizeTooLargeError("the record is larger than the producer's max request size")
        self.appended.append((topic, value))
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.answers.append(answer)
        return answer


async def appended(producer: FakeProducer, n: int) -> None:
    """Wait (1 s at most) until the producer appended ``n`` records."""
    for _ in range(1000):
        if len(producer.appended) >= n:
            return
        await asyncio.sleep(0.001)


def sends(producer: FakeProducer) -> tuple[DirectSends, list[str]]:
    tracked: list[str] = []
    return DirectSends(lambda: producer, tracked.append), tracked


async def test_a_send_is_appended_before_it_returns_and_settles_with_the_brokers_answer() -> None:
    producer = FakeProducer()
    direct, tracked = sends(producer)
    sent = direct.send("t", b"k", b"v1", partition=3)
    assert producer.appended == [("t", b"v1")]  # on the caller's stack: no task, no loop turn
    assert tracked == ["t"]
    assert not sent.done()
    producer.answers[0].set_result("metadata of v1")
    await asyncio.sleep(0)
    assert sent.result() == "metadata of v1"


async def test_a_failed_answer_fails_the_send() -> None:
    producer = FakeProducer()
    direct, _ = sends(producer)
    sent = direct.send("t", b"k", b"v1")
    producer.answers[0].set_exception(ConnectionError("broker gone"))
    with pytest.raises(ConnectionError):
        await asyncio.wait_for(sent, 1)


async def test_a_record_refused_at_once_fails_its_own_send_only() -> None:
    producer = FakeProducer()
    direct, _ = sends(producer)
    too_large = direct.send("t", b"k", b"x" * 101)
    after = direct.send("t", b"k", b"v2")
    with pytest.raises(RecordTooLarge, match="max request size"):
        await asyncio.wait_for(too_large, 1)
    assert producer.appended == [("t", b"v2")]
    assert not after.done()


async def test_records_of_a_topic_sent_while_one_waits_queue_behind_it_in_order() -> None:
    producer = FakeProducer()
    producer.unknown.add("new")
    direct, _ = sends(producer)
    first = direct.send("new", b"k", b"v1")  # waits for the topic's metadata, in a task
    other = direct.send("known", b"k", b"v2")  # another topic goes on
    third = direct.send("new", b"k", b"v3")
    await asyncio.sleep(0.01)
    assert producer.appended == [("known", b"v2")]  # nothing of "new" overtakes its waiting record
    producer.metadata.set()
    await appended(producer, 3)
    assert producer.appended == [("known", b"v2"), ("new", b"v1"), ("new", b"v3")]
    for i, answer in enumerate(producer.answers):
        answer.set_result(i)
    assert await asyncio.wait_for(asyncio.gather(other, first, third), 1) == [0, 1, 2]
    direct.send("new", b"k", b"v4")  # its queue drained: appended at once again
    assert producer.appended[-1] == ("new", b"v4")


async def test_a_topic_with_too_many_records_queued_fails_the_next_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct_module, "MAX_QUEUED", 2)
    producer = FakeProducer()
    producer.unknown.add("new")
    direct, _ = sends(producer)
    waiting = [direct.send("new", b"k", f"v{i}".encode()) for i in range(3)]  # one waits, two queue
    refused = direct.send("new", b"k", b"v3")
    with pytest.raises(KafkaTimeoutError, match="already wait"):
        await asyncio.wait_for(refused, 1)
    producer.metadata.set()
    await appended(producer, 3)
    assert producer.appended == [("new", b"v0"), ("new", b"v1"), ("new", b"v2")]
    assert not any(sent.done() for sent in waiting)


async def test_stopping_fails_the_waiting_send_and_those_queued_behind_it() -> None:
    producer = FakeProducer()
    producer.unknown.add("new")
    direct, _ = sends(producer)
    first = direct.send("new", b"k", b"v1")
    second = direct.send("new", b"k", b"v2")
    await asyncio.sleep(0)
    await asyncio.wait_for(direct.stop(), 5)
    for sent in (first, second):
        with pytest.raises(ConnectionError, match="not running"):
            await asyncio.wait_for(sent, 1)
    assert producer.appended == []
    producer.unknown.clear()
    third = direct.send("new", b"k", b"v3")  # a stopped producer takes nothing any more: its sender retries it
    with pytest.raises(ConnectionError, match="not running"):
        await asyncio.wait_for(third, 1)
    assert producer.appended == []


async def test_records_sent_before_the_producer_started_wait_for_it_in_order_and_then_go_out() -> None:
    """Faust makes a new aiokafka producer as it starts: a record appended to one made before would never leave."""
    producer = FakeProducer()
    direct = DirectSends(lambda: producer, lambda topic: None, started=False)
    early = [direct.send("t", b"k", f"v{i}".encode()) for i in range(3)]
    other = direct.send("u", b"k", b"w")
    await asyncio.sleep(0.01)
    assert producer.appended == [] and not any(sent.done() for sent in [*early, other])
    direct.running.set()  # the producer's start finished
    await appended(producer, 4)
    assert [value for topic, value in producer.appended if topic == "t"] == [b"v0", b"v1", b"v2"]
    later = direct.send("t", b"k", b"v3")  # nothing waits any more: on the caller's stack again
    assert producer.appended[-1] == ("t", b"v3")
    for answer in producer.answers:
        answer.set_result("confirmed")
    assert [await asyncio.wait_for(sent, 1) for sent in [*early, other, later]] == ["confirmed"] * 5


async def test_a_producer_that_never_starts_fails_the_records_waiting_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct_module, "START_WAIT_S", 0.05)
    producer = FakeProducer()
    direct = DirectSends(lambda: producer, lambda topic: None, started=False)
    first, second = direct.send("t", b"k", b"v1"), direct.send("t", b"k", b"v2")
    for sent in (first, second):
        with pytest.raises(ConnectionError, match="did not start|not running"):
            await asyncio.wait_for(sent, 1)
    assert producer.appended == []


async def test_a_producer_that_is_not_running_fails_the_send() -> None:
    def not_ready() -> Any:
        raise RuntimeError("Producer service not yet started")

    direct = DirectSends(not_ready, lambda topic: None)
    with pytest.raises(RuntimeError, match="not yet started"):
        await asyncio.wait_for(direct.send("t", b"k", b"v"), 1)


def riding(producer: FakeProducer) -> DirectSends:
    return DirectSends(lambda: producer, lambda topic: None, riders=frozenset({"events"}))


async def test_a_rider_waits_for_the_next_other_record_and_goes_just_ahead_of_it() -> None:
    producer = FakeProducer()
    direct = riding(producer)
    first = direct.send("events", b"k", b"e1")
    second = direct.send("events", b"k", b"e2")
    assert producer.appended == []  # held: no request of its own
    entry = direct.send("changelog", b"k", b"c1")
    # on the caller's stack, in the order they were sent: one request carries all three
    assert producer.appended == [("events", b"e1"), ("events", b"e2"), ("changelog", b"c1")]
    for answer, metadata in zip(producer.answers, ("m1", "m2", "m3"), strict=True):
        answer.set_result(metadata)
    await asyncio.sleep(0)
    assert (first.result(), second.result(), entry.result()) == ("m1", "m2", "m3")


async def test_a_rider_with_nothing_to_ride_with_goes_alone_after_its_wait() -> None:
    producer = FakeProducer()
    direct = riding(producer)
    started = asyncio.get_running_loop().time()
    sent = direct.send("events", b"k", b"e1")
    await appended(producer, 1)
    assert producer.appended == [("events", b"e1")]
    assert asyncio.get_running_loop().time() - started >= direct_module.RIDE_S * 0.9
    producer.answers[0].set_result("m1")
    assert await asyncio.wait_for(sent, 1) == "m1"
    direct.send("changelog", b"k", b"c1")  # nothing held any more: only the new record goes
    assert producer.appended == [("events", b"e1"), ("changelog", b"c1")]


async def test_stopping_sends_the_held_riders_first() -> None:
    producer = FakeProducer()
    direct = riding(producer)
    direct.send("events", b"k", b"e1")
    await asyncio.wait_for(direct.stop(), 5)
    assert producer.appended == [("events", b"e1")]  # into aiokafka's batch, which the producer's stop flushes
    late = direct.send("events", b"k", b"e2")  # after the stop a rider fails at once, as every record does
    with pytest.raises(ConnectionError, match="not running"):
        await asyncio.wait_for(late, 1)
