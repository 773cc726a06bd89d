"""The stand-ins the ledger's unit tests share: a table whose writes are confirmed at once, an outbox whose
sends are kept and confirmed at once, and the Faust event the ledger handles."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from faust.types import TP

from agents_stream.kafka.outbox import Outbox
from agents_stream.kafka.watermark import Watermark

Lookup = Callable[[str, tuple[str, int, int], float], Awaitable[Any]]

#: the Kafka timestamp (seconds) of every record ``event`` makes unless told: 2026-12-01T10:00:00Z
EVENT_TIMESTAMP = 1796119200.0


def faust_event(
    tp: TP, offset: int, key: bytes | None, value: bytes | None, *, timestamp: float | None = EVENT_TIMESTAMP,
    headers: Any = (),
) -> SimpleNamespace:
    """A Faust event of the record at ``tp``@``offset``, with what of it the ledger reads."""
    message = SimpleNamespace(tp=tp, topic=tp.topic, offset=offset, headers=list(headers), timestamp=timestamp)
    return SimpleNamespace(message=message, key=key, value=value)


class Table(dict):  # type: ignore[type-arg]
    """A table as the ledger writes it: each write or delete leaves a changelog future, confirmed at once."""

    last_changelog: asyncio.Future[Any] | None = None

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self._confirmed()

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        self._confirmed()

    def _confirmed(self) -> None:
        self.last_changelog = asyncio.get_running_loop().create_future()
        self.last_changelog.set_result("ok")


async def _no_dead_letter(dlq: str, source: tuple[str, int, int], since: float) -> None:
    return None


def recording_outbox(find_dead_letter: Lookup = _no_dead_letter) -> tuple[Outbox, list[tuple[str, bytes | None]]]:
    """An outbox whose sends are kept as (topic, value) and confirmed at once; ``find_dead_letter`` answers its
    look for an earlier dead letter (none, by default)."""
    sent: list[tuple[str, bytes | None]] = []

    def channel(topic: str) -> SimpleNamespace:
        def send_soon(*, key: bytes | None, value: bytes | None, partition: int | None = None, headers: Any = None):
            sent.append((topic, value))
            fut = asyncio.get_running_loop().create_future()
            fut.set_result("ok")
            return fut

        return SimpleNamespace(send_soon=send_soon)

    return Outbox(channel, Watermark(), "w1", find_dead_letter=find_dead_letter), sent
