"""Layer 3 for our own sends: a send counts as done only once the broker confirmed it, and is retried until then."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

import faust
from aiokafka.errors import MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError
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


class RecordTooLarge(Exception):
    """The record is larger than the producer's request size or the broker's message size: sending it again
    can never succeed, so it is not retried (docs/decisions.md, "Records too large never loop and never crash")."""


def too_large(exc: BaseException) -> bool:
    """``exc`` says the record is too large for the producer or the broker (the producer's own check and the
    broker's MESSAGE_TOO_LARGE are both MessageSizeTooLargeError in aiokafka), or is our own RecordTooLarge."""
    if isinstance(exc, ProducerSendError) and exc.__cause__ is not None:
        exc = exc.__cause__
    return isinstance(exc, (RecordTooLarge, MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError))


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
    make it smaller, and retrying would hold its offset forever.
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


class GuardedTopic(faust.Topic):
    """Faust's topic (the app's ``Topic`` class, so changelogs too) whose buffered sends fail their own future when
    the record is too large, instead of raising inside Faust's ProducerBuffer, where the error kills the worker
    ("We experienced a crash!") and strands every task behind it."""

    async def publish_message(self, fut: FutureMessage, wait: bool = False) -> Awaitable[RecordMetadata]:
        try:
            return await super().publish_message(fut, wait=wait)
        except ProducerSendError as exc:  # Faust's wrapper of the producer's own error
            if wait or not too_large(exc):
                raise
            log.error(
                "A record for %s is too large to send (%s); it is not sent and its send fails for good. Bound what "
                "grows the record, or raise AGENTS_STREAM_RECORD_MAX_BYTES and the topic's max.message.bytes",
                self.get_topic_name(), exc,
            )
            if not fut.done():
                fut.set_exception(RecordTooLarge(str(exc)))
            return fut
