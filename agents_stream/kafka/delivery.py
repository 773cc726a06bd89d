"""Layer 3 for our own sends: retry a Kafka send until the broker confirms it, never count it done before."""

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
    fut = first if first is not None else send()
    attempt = 0
    while True:
        try:
            if not fut.done():  # asyncio.wait neither cancels the send on a timeout nor needs a shield
                await asyncio.wait((fut,), timeout=CONFIRM_TIMEOUT_S)
            if not fut.done():
                raise TimeoutError(f"no answer from the broker within {CONFIRM_TIMEOUT_S:.0f}s")
            fut.result()  # the send's own error, if any
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            attempt += 1
            delay = backoff(attempt, base=0.5, cap=10.0)
            log.warning(
                "Send of %s not confirmed by the broker (%r); it does not count as done. Retry %d in %.1fs; "
                "check the broker if this repeats.",
                what, exc, attempt, delay,
            )
            if attempt == ALERT_AFTER:
                alert(exc)
            await asyncio.sleep(delay)
            fut = send()
