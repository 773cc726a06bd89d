"""The app's topics (agents_stream.kafka.delivery.GuardedTopic) send a raw record straight into the producer's batches
(kafka.direct), every record of such a topic alike, so they keep their order; anything else takes Faust's buffer.
A Faust app that is never started, its producer's direct sends given a fake aiokafka producer: no broker."""

from __future__ import annotations

import asyncio

import faust
import pytest

from agents_stream.kafka.delivery import GuardedTopic, SendRefused
from agents_stream.kafka.direct import DirectSends
from tests.unit.kafka.test_direct import FakeProducer


def app_with_direct_sends() -> tuple[faust.App, FakeProducer]:
    app = faust.App("guarded-unit", broker="kafka://127.0.0.1:1", Topic=GuardedTopic)
    producer = FakeProducer()
    app.producer.direct = DirectSends(lambda: producer, lambda topic: None)  # as the worker's IdempotentProducer has
    return app, producer


async def test_a_raw_topics_records_go_straight_to_the_producer_in_order_and_settle_with_its_answer() -> None:
    app, producer = app_with_direct_sends()
    results = app.topic("agent.results", key_serializer="raw", value_serializer="raw")
    first = results.send_soon(key=b"t1", value=b"one", headers=[("trace", b"x")])
    second = results.send_soon(key="t2", value="two")  # text as the raw codec writes it: UTF-8
    assert producer.appended == [("agent.results", b"one"), ("agent.results", b"two")], "on the caller's stack"
    producer.answers[0].set_result("offset 7")
    producer.answers[1].set_exception(ConnectionError("broker gone"))
    assert await asyncio.wait_for(first, 1) == "offset 7"
    with pytest.raises(ConnectionError):
        await asyncio.wait_for(second, 1)
    assert app.producer.buffer.pending.qsize() == 0, "nothing went through Faust's buffer"


async def test_a_topic_that_is_not_raw_and_a_send_with_a_callback_take_fausts_buffer() -> None:
    app, producer = app_with_direct_sends()
    app.topic("typed", value_serializer="json").send_soon(key=b"k", value={"a": 1})
    app.topic("agent.results", key_serializer="raw", value_serializer="raw").send_soon(
        key=b"k", value=b"v", callback=lambda fut: None)
    assert producer.appended == []
    assert app.producer.buffer.pending.qsize() == 2


async def test_an_invalid_topic_name_fails_its_send_for_good_without_asking_the_broker() -> None:
    app, producer = app_with_direct_sends()
    sent = app.topic("agent.outcomes.no such app!", key_serializer="raw", value_serializer="raw").send_soon(
        key=b"k", value=b"v")
    with pytest.raises(SendRefused, match="not a valid topic name"):
        await asyncio.wait_for(sent, 1)
    assert producer.appended == []
