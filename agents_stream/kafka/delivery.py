"""Layer 3 for our own sends: a send counts as done only once the broker confirmed it, and is retried until then."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any, Awaitable, Callable

import faust
from aiokafka.errors import (
    InvalidTopicError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
)
from faust.exceptions import ProducerSendError
from faust.types.tuples import FutureMessage, RecordMetadata

from agents_stream.contract.errors import Fenced
from agents_stream.resilience.backoff import backoff

log = logging.getLogger(__name__)

#: Starts one attempt of a send and returns its future; called again for each retry.
Send = Callable[[], "asyncio.Future[Any]"]

CONFIRM_TIMEOUT_S = 30.0
ALERT_AFTER = 3  # failed attempts before operators hear of it
#: room a record's key, headers and batch framing take beside its value, within AGENTS_STREAM_RECORD_MAX_BYTES
RECORD_OVERHEAD_BYTES = 8192


class Undeliverable(Exception):
    """A send that can never succeed: it fails for good, at once, and is never retried (retrying would hold its
    offset forever, and raising inside Faust's producer buffer would stop the worker)."""


class RecordTooLarge(Undeliverable):
    """The record is larger than the producer's request size or the broker's message size: sending it again
    can never succeed, so it is not retried (docs/decisions.md, "Records too large never loop and never crash")."""


class SendRefused(Undeliverable):
    """The topic's name is not a legal Kafka topic name, or the broker refuses this worker's principal on it
    (TopicAuthorizationFailed): the send fails for good (docs/security.md, "A task's parent")."""


#: a legal Kafka topic name; anything else would make the producer ask the broker for its metadata until its
#: request timeout (20 minutes under Faust), holding every send of the worker behind it
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def refused_topic(topic: str) -> str | None:
    """Why no record can ever be sent to ``topic`` (its name is not a legal topic name), or None."""
    if _TOPIC_NAME.match(topic) and topic not in (".", ".."):
        return None
    return f"{topic!r} is not a valid topic name"


def too_large(exc: BaseException) -> bool:
    """``exc`` says the record is too large for the producer or the broker (the producer's own check and the
    broker's MESSAGE_TOO_LARGE are both MessageSizeTooLargeError in aiokafka), or is our own RecordTooLarge."""
    if isinstance(exc, ProducerSendError) and exc.__cause__ is not None:
        exc = exc.__cause__
    return isinstance(exc, (RecordTooLarge, MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError))


def refused(exc: BaseException) -> bool:
    """``exc`` says the broker will never take a record on that topic from this worker: its principal is not
    authorized there, or the name is invalid (or is our own SendRefused)."""
    if isinstance(exc, ProducerSendError) and exc.__cause__ is not None:
        exc = exc.__cause__
    return isinstance(exc, (SendRefused, TopicAuthorizationFailedError, InvalidTopicError))


def undeliverable(exc: BaseException) -> Undeliverable | None:
    """``exc`` as the Undeliverable it means (too large, or refused), or None when a retry may succeed."""
    if isinstance(exc, Undeliverable):
        return exc
    if too_large(exc):
        return RecordTooLarge(str(exc))
    if refused(exc):
        return SendRefused(str(exc))
    return None


def retry_delay(attempt: int) -> float:
    """Seconds before retry ``attempt`` of an unconfirmed send."""
    return backoff(attempt, base=0.5, cap=10.0)


def is_confirmed(fut: "asyncio.Future[Any]") -> bool:
    """The send behind ``fut`` is done and the broker has it."""
    return fut.done() and not fut.cancelled() and fut.exception() is None


async def until_confirmed(
    send: Send,
    *,
    what: str,
    alert: Callable[[BaseException], None],
    first: "asyncio.Future[Any] | None" = None,
    timeout: float = CONFIRM_TIMEOUT_S,
    delay: Callable[[int], float] = retry_delay,
    still_mine: Callable[[], bool] = lambda: True,
) -> None:
    """Await ``send``'s confirmation, re-sending with backoff until the broker has it.

    ``still_mine()`` is asked before each re-send: False (the partition the send belongs to was revoked) raises
    Fenced instead, so a worker never re-sends state of a partition another worker owns now.

    ``first`` is an attempt already started (its future). A send unconfirmed
    after ``timeout`` is sent again, so a slow broker can leave a duplicate
    record; that is the price of never treating it as done. A record too large
    for the producer or the broker raises RecordTooLarge at once: no retry can
    make it smaller, and retrying would hold its offset forever; a send the
    broker refuses (an invalid topic name, not authorized) raises SendRefused.
    """
    fut = first if first is not None else send()
    attempt = 0
    while True:
        try:
            if not fut.done():  # asyncio.wait neither cancels the send on a timeout nor needs a shield
                await asyncio.wait((fut,), timeout=timeout)
            if not fut.done():
                raise TimeoutError(f"no answer from the broker within {timeout:.0f}s")
            fut.result()  # the send's own error, if any
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if too_large(exc):
                raise RecordTooLarge(f"{what}: {exc}") from exc
            if refused(exc):
                raise SendRefused(f"{what}: {exc}") from exc
            attempt += 1
            wait = delay(attempt)
            log.warning(
                "Send of %s not confirmed by the broker (%r); it does not count as done. Retry %d in %.1fs; "
                "check the broker if this repeats.",
                what, exc, attempt, wait,
            )
            if attempt == ALERT_AFTER:
                alert(exc)
            await asyncio.sleep(wait)
            if not still_mine():
                raise Fenced(f"{what}: not sent again, its partition is no longer this worker's") from exc
            fut = send()


#: how long a send to a topic the producer has no metadata for waits for it before failing for good
UNKNOWN_TOPIC_WAIT_S = 5.0
#: how long a topic found missing is refused at once before the broker is asked again
MISSING_TOPIC_TTL_S = 60.0


class TopicCheck:
    """Whether a topic exists, asked before a record for it enters Faust's producer buffer. The buffer sends one
    record at a time and the producer waits for an unknown topic's metadata for its whole request timeout (20
    minutes in Faust), so one record for a topic that does not exist (another app id a task's parent named, with
    topic creation off) held every send of the worker. A topic unknown to the producer is looked up in a task of its
    own (one metadata request, ``UNKNOWN_TOPIC_WAIT_S`` at most; no answer: sent as usual); a missing one is refused
    at once for ``MISSING_TOPIC_TTL_S``.

    ``client()``: the producer's aiokafka client, or None before it started (then every topic counts as known)."""

    def __init__(self, client: Callable[[], Any]) -> None:
        self.client = client
        self.missing: dict[str, float] = {}  # topic → when it was found missing (monotonic)
        self.seen: set[str] = set()  # topics the producer had metadata for (asked once each: every send asks)

    def known(self, topic: str) -> bool:
        if topic in self.seen:
            return True
        client = self.client()
        if client is None:
            return True
        if topic in client.cluster.topics():  # a new set each call: not on every send
            self.seen.add(topic)
            return True
        return False

    async def exists(self, topic: str) -> bool:
        client = self.client()
        if client is None or topic in client.cluster.topics():
            return True
        since = self.missing.get(topic)
        if since is not None and time.monotonic() - since < MISSING_TOPIC_TTL_S:
            return False
        try:  # one metadata request for every topic: asking for this one would make the producer track it
            metadata = await asyncio.wait_for(client.fetch_all_metadata(), UNKNOWN_TOPIC_WAIT_S)
            found = topic in metadata.topics()
        except (asyncio.TimeoutError, KafkaError) as exc:
            log.warning("Could not tell whether topic %s exists (%r); its record is sent as usual", topic, exc)
            return True
        if not found:
            self.missing[topic] = time.monotonic()
            log.warning("Topic %s does not exist: records for it fail for good. If it is one of this app's, create "
                        "it; if a task named it (its parent's app id), the task's producer is at fault", topic)
            return False
        self.missing.pop(topic, None)
        return True


class GuardedTopic(faust.Topic):
    """Faust's topic (the app's ``Topic`` class, so changelogs too) whose buffered sends fail their own future when
    the send can never succeed (the record is too large, the topic's name is invalid, the broker refuses this
    worker on it), instead of raising inside Faust's ProducerBuffer, where the error kills the worker ("We
    experienced a crash!") and strands every task behind it, or waiting there for an invalid topic's metadata.

    A topic of raw keys and values (every topic the app writes) skips Faust's buffer: its ``send_soon`` hands the
    record to the worker's direct sends (``kafka.direct``), all of that topic's records alike, so they keep their
    order. Its future settles with the broker's answer (a RecordMetadata), as Faust's does; Faust's send sensors
    do not see these records (the app does not use them). Another topic, a send that asks for a callback, a
    timestamp or a schema, and a producer without direct sends (a plain Faust app) take Faust's path."""

    def send_soon(  # type: ignore[override]  # Faust's FutureMessage or, sent direct, an asyncio.Future: both await
        self, *, key: Any = None, value: Any = None, partition: int | None = None, headers: Any = None,
        **options: Any,
    ) -> "asyncio.Future[Any]":
        """Faust's ``send_soon``; ``options`` are its other keywords (a timestamp, a schema, a callback, ...)."""
        direct = getattr(self.app.producer, "direct", None)
        if (direct is None or self.key_serializer != "raw" or self.value_serializer != "raw"
                or any(option not in (None, False, "raw") for option in options.values())
                or self.app.in_transaction):
            return super().send_soon(
                key=key, value=value, partition=partition, headers=headers, **options)
        topic = self.get_topic_name()
        invalid = refused_topic(topic)
        if invalid is not None:  # never asked of the broker: no wait on its metadata
            return self._fail(asyncio.get_running_loop().create_future(), SendRefused(invalid))
        if isinstance(headers, dict):
            headers = list(headers.items())
        sent: asyncio.Future[Any] = direct.send(topic, _raw(key), _raw(value), partition=partition,
                                                headers=headers or None)
        return sent

    async def publish_message(self, fut: FutureMessage, wait: bool = False) -> Awaitable[RecordMetadata]:
        invalid = refused_topic(self.get_topic_name())
        if invalid is not None and not wait:  # never asked of the broker: no wait on its metadata
            return self._fail(fut, SendRefused(invalid))
        try:
            return await super().publish_message(fut, wait=wait)
        except ProducerSendError as exc:  # Faust's wrapper of the producer's own error
            if wait:
                raise
            permanent = undeliverable(exc)
            if permanent is not None:
                return self._fail(fut, permanent)
            # A transient error (the producer's buffer stayed full for its request timeout while a broker was away):
            # raised here it would crash the worker; the send fails instead and its sender sends it again (the
            # outbox retries until confirmed; a heartbeat or control event is best effort).
            log.warning("A record for %s was not sent (%r); its sender retries it. Check the brokers if this repeats",
                        self.get_topic_name(), exc)
            if not fut.done():
                fut.set_exception(exc)
            return fut

    def _fail(self, fut: "asyncio.Future[Any]", exc: Undeliverable) -> "asyncio.Future[Any]":
        """``fut`` fails for good with ``exc`` (and operators read what to do)."""
        log_undeliverable(self.get_topic_name(), exc)
        if not fut.done():
            fut.set_exception(exc)
        return fut


def _raw(data: Any) -> bytes | None:
    """A key or value as the raw codec writes it: bytes as they are, text as UTF-8."""
    return data.encode("utf-8") if isinstance(data, str) else data


def log_undeliverable(topic: str, exc: Undeliverable) -> None:
    """Tell operators that a record for ``topic`` fails for good, and what to do."""
    if isinstance(exc, RecordTooLarge):
        log.error(
            "A record for %s is too large to send (%s); it is not sent and its send fails for good. Bound what "
            "grows the record, or raise AGENTS_STREAM_RECORD_MAX_BYTES and the topic's max.message.bytes", topic, exc,
        )
    else:
        log.error(
            "A record for %s can never be sent (%s); it is not sent and its send fails for good. If this topic "
            "is one of this app's, grant the worker's principal Write on it (scripts/acls.sh); if a task's "
            "parent named it, the task's producer is at fault", topic, exc,
        )
