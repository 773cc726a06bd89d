"""Layer 3 retries of our own sends (agents_stream.kafka.delivery), without a broker."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import MessageSizeTooLargeError

from agents_stream.kafka.delivery import ALERT_AFTER, is_confirmed, until_confirmed


def scripted(outcomes: list[BaseException | None]):
    """A send whose attempts fail or succeed in the order given; returns (send, attempts list)."""
    attempts: list[int] = []

    def send() -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        outcome = outcomes[len(attempts)]
        attempts.append(1)
        if outcome is None:
            fut.set_result("ok")
        else:
            fut.set_exception(outcome)
        return fut

    return send, attempts


async def test_a_failed_send_is_sent_again_until_confirmed_and_alerts_once():
    """A send the broker refused is never counted done: it is retried until confirmed; operators are alerted once."""
    send, attempts = scripted([ConnectionError("down")] * ALERT_AFTER + [None])
    alerts: list[BaseException] = []
    await asyncio.wait_for(until_confirmed(send, what="test", alert=alerts.append), timeout=20)
    assert len(attempts) == ALERT_AFTER + 1
    assert len(alerts) == 1 and isinstance(alerts[0], ConnectionError)


async def test_an_attempt_already_started_is_awaited_not_repeated():
    """With ``first`` given, a send that succeeds is not sent a second time."""
    send, attempts = scripted([None])
    first = send()
    await until_confirmed(send, what="test", alert=lambda exc: None, first=first)
    assert len(attempts) == 1


async def test_a_send_the_broker_never_answers_is_sent_again_after_the_timeout():
    """An attempt with no answer is not waited on forever: after the timeout it is sent again (and not cancelled)."""
    loop = asyncio.get_running_loop()
    hung = loop.create_future()
    sent: list[asyncio.Future] = []

    def send() -> asyncio.Future:
        fut = hung if not sent else loop.create_future()
        if sent:
            fut.set_result("ok")
        sent.append(fut)
        return fut

    await asyncio.wait_for(
        until_confirmed(send, what="test", alert=lambda exc: None, first=send(), timeout=0.05, delay=lambda n: 0.01),
        timeout=5,
    )
    assert len(sent) == 2
    assert not hung.cancelled()  # the first attempt may still land: a duplicate is allowed, a loss is not


async def test_only_a_send_the_broker_answered_without_error_is_confirmed():
    """The predicate the outbox concludes deliveries with: pending, failed and cancelled sends are not confirmed."""
    loop = asyncio.get_running_loop()
    pending, failed, cancelled, ok = (loop.create_future() for _ in range(4))
    failed.set_exception(ConnectionError("down"))
    cancelled.cancel()
    ok.set_result("ok")
    assert [is_confirmed(f) for f in (pending, failed, cancelled, ok)] == [False, False, False, True]


async def test_a_record_too_large_is_not_sent_again():
    """MessageSizeTooLarge can never go away by retrying: until_confirmed gives up after the first attempt
    (RecordTooLarge), instead of looping and holding the slot and the partition's commit forever."""
    from agents_stream.kafka.delivery import RecordTooLarge

    send, attempts = scripted([MessageSizeTooLargeError("1500000 bytes")] + [None] * 5)
    with pytest.raises(RecordTooLarge):
        await asyncio.wait_for(until_confirmed(send, what="t", alert=lambda exc: None, delay=lambda a: 0.01), 5)
    assert len(attempts) == 1
