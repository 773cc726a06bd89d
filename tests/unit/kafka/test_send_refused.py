"""A send the broker will never take (an invalid topic name, a topic this worker may not write) fails for good:
never retried, its offset released with an alert (agents_stream.kafka.delivery, outbox), without a broker."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiokafka.errors import TopicAuthorizationFailedError
from faust.exceptions import ProducerSendError

from agents_stream.contract import topics
from agents_stream.kafka.delivery import SendRefused, refused_topic, undeliverable, until_confirmed
from tests.unit.kafka.test_delivery import scripted
from tests.unit.kafka.test_outbox import SOURCE, Producer, _outbox


def test_only_legal_topic_names_are_sent_to() -> None:
    assert refused_topic("agent.outcomes.my-app_2") is None
    assert refused_topic("agent.outcomes.no such app!") == "'agent.outcomes.no such app!' is not a valid topic name"
    assert refused_topic("agent.outcomes." + "a" * 240) is not None, "longer than Kafka's 249 characters"
    assert refused_topic("agent.outcomes.é") is not None


def test_an_authorization_failure_wrapped_by_faust_is_a_refusal() -> None:
    wrapped = ProducerSendError("Error while sending")
    wrapped.__cause__ = TopicAuthorizationFailedError("agent.outcomes.other")
    assert isinstance(undeliverable(wrapped), SendRefused)
    assert undeliverable(ProducerSendError("timeout")) is None, "anything else may succeed when retried"


async def test_a_send_refused_for_authorization_is_not_sent_again() -> None:
    send, attempts = scripted([TopicAuthorizationFailedError("agent.outcomes.other")] + [None] * 5)
    with pytest.raises(SendRefused):
        await asyncio.wait_for(until_confirmed(send, what="t", alert=lambda exc: None, delay=lambda a: 0.01), 5)
    assert len(attempts) == 1


async def test_a_refused_send_releases_its_offset_with_an_alert() -> None:
    """The delivery of an event whose send the broker refuses gives up at once: the partition commits past it
    (nothing else waits behind it) and operators get alert.send_refused."""
    producer = Producer()
    outbox = _outbox(producer, retry_delay=lambda attempt: 0.0)
    outbox.watermark.handled(SOURCE, 7)
    outbox.deliver(SOURCE, 7, [outbox.record("agent.outcomes.other", b"t1", b"{}")])
    producer.sent[0][-1].set_exception(TopicAuthorizationFailedError("agent.outcomes.other"))
    for _ in range(50):
        await asyncio.sleep(0)
        if outbox.delivering() == 0:
            break
    assert len([s for s in producer.sent if s[0] == "agent.outcomes.other"]) == 1, "sent once, never again"
    assert outbox.delivering() == 0 and outbox.watermark.commit_offset(SOURCE) == 8
    assert [json.loads(s[2])["event"] for s in producer.sent if s[0] == topics.CONTROL] == ["alert.send_refused"]
    await outbox.stop()
