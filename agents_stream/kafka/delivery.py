"""Layer 3 for our own sends: a send counts as done only once the broker confirmed it, and is retried until then."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from agents_stream.resilience.backoff import backoff

log = logging.getLogger(__name__)

#: Starts one attempt of a send and returns its future; called again for each retry.
Send = Callable[[], "asyncio.Future[Any]"]

CONFIRM_TIMEOUT_S = 30.0
ALERT_AFTER = 3  # failed attempts before operators hear of it


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
) -> None:
    """Await ``send``'s confirmation, re-sending with backoff until the broker has it.

    ``first`` is an attempt already started (its future). A send unconfirmed
    after ``timeout`` is sent again, so a slow broker can leave a duplicate
    record; that is the price of never treating it as done.
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
            fut = send()
