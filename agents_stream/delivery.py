"""Layer 3 for our own sends: retry a Kafka send until the broker confirms it, never count it done before."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, TypeVar

from agents_stream.backoff import backoff

log = logging.getLogger(__name__)

#: Starts one attempt of a send and returns its future; called again for each retry.
Send = Callable[[], "asyncio.Future[Any]"]
T = TypeVar("T")

CONFIRM_TIMEOUT_S = 30.0
ALERT_AFTER = 3  # failed attempts before operators hear of it


async def confirmed(
    send: Send,
    *,
    what: str,
    alert: Callable[[BaseException], None],
    first: "asyncio.Future[Any] | None" = None,
) -> None:
    """Await ``send``'s confirmation, re-sending with backoff until the broker has it.

    ``first`` is an attempt already started (its future). A send unconfirmed
    after ``CONFIRM_TIMEOUT_S`` is sent again, so a slow broker can leave a
    duplicate record; that is the price of never treating it as done.
    """

    async def attempt(n: int) -> None:
        fut = first if n == 0 and first is not None else send()
        if not fut.done():  # asyncio.wait neither cancels the send on a timeout nor needs a shield
            await asyncio.wait((fut,), timeout=CONFIRM_TIMEOUT_S)
        if not fut.done():
            raise TimeoutError(f"no answer from the broker within {CONFIRM_TIMEOUT_S:.0f}s")
        fut.result()  # the send's own error, if any

    await retried(attempt, failed=f"Send of {what} not confirmed by the broker; it does not count as done", alert=alert)


async def retried(attempt: Callable[[int], Awaitable[T]], *, failed: str, alert: Callable[[BaseException], None]) -> T:
    """``attempt(0)``, ``attempt(1)``, ... with backoff until one returns; operators hear of it (``alert``) after
    ALERT_AFTER failures. ``failed`` says in the log what did not happen and what that means."""
    n = 0
    while True:
        try:
            return await attempt(n)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            n += 1
            delay = backoff(n, base=0.5, cap=10.0)
            log.warning("%s (%r). Retry %d in %.1fs; check the broker if this repeats.", failed, exc, n, delay)
            if n == ALERT_AFTER:
                alert(exc)
            await asyncio.sleep(delay)
