"""Layer-1 dead letters: a message no agent can use gets exactly one dead letter, across redeliveries and owners."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from faust.types import TP

from agents_stream.contract import topics
from agents_stream.contract.errors import PoisonMessage
from agents_stream.contract.events import DeadLettered, DeadLetterRequest, encode
from agents_stream.kafka.outbox import Outbox
from agents_stream.ledger.intake import HISTORY_HEADER, requeue_headers
from agents_stream.ops import metrics
from agents_stream.tables.definitions import KeyedTable
from agents_stream.tables.expiry import POISON_PREFIX, marked_message

log = logging.getLogger(__name__)

DONE = "done"  # a marker's state once the dead letter is confirmed (see Poison.marker)
MARK_EVENT = encode(DeadLettered())
DEAD_LETTER_REQUEST = encode(DeadLetterRequest())


def poison_key(topic: str, offset: int) -> str:
    """A poison message's marker in the task table (on its own partition: the changelog follows the source)."""
    return f"{POISON_PREFIX}{topic}/{offset}"


def poison_source(marker: str, partition: int) -> tuple[TP, int] | None:
    """(partition, offset) of the poison message a marker key (see poison_key) names."""
    marked = marked_message(marker)
    return None if marked is None else (TP(marked[0], partition), marked[1])


def reason_of(poison: PoisonMessage) -> str:
    """The ``error_reason`` header of a poison message's dead letter."""
    return poison.reason + (f": {poison.detail}" if poison.detail else "")


def dead_letter_unreadable(
    outbox: Outbox, tp: TP, offset: int, key: bytes | None, value: bytes | None, poison: PoisonMessage, *,
    what: str, topic: str,
) -> None:
    """A record of ``what`` (an approval decision, a job request) that cannot be read: one dead letter on ``topic``."""
    log.warning("Dead-lettering %s %s[%d]@%d: %s", what, tp.topic, tp.partition, offset, poison)
    send_dead_letter(outbox, Unreadable(tp, offset, key, value), agent="", reason=reason_of(poison), topic=topic)


@dataclass(frozen=True)
class Unreadable:
    """A record that cannot be read, where it was read: what its dead letter carries."""

    tp: TP
    offset: int
    key: bytes | None
    value: bytes | None


def send_dead_letter(
    outbox: Outbox, message: Unreadable, *, agent: str, reason: str, headers: Iterable[tuple[str, bytes]] = (),
    topic: str | None = None, then: Iterable[Callable[[], object]] = (), sent_since: float | None = None,
) -> None:
    """Dead-letter ``message`` (a control event says so): layer 1 ("schema"), one attempt, as it never reached a
    provider. Its offset is held until the dead letter is confirmed, then ``then`` runs."""
    tp, offset, key, layer = message.tp, message.offset, message.key, "schema"
    sends = [outbox.dead_letter(
        tp, offset, key, message.value, agent=agent, reason=reason, layer=layer, attempts=1, headers=headers,
        topic=topic, sent_since=sent_since,
    )]
    subject = (key or b"").decode("utf-8", "replace") or f"{tp.topic}:{tp.partition}:{offset}"
    outbox.control("task.dead_lettered", subject, agent, {"reason": reason, "layer": layer})
    counted = lambda: metrics.dead_letters.labels(agent or metrics.NO_AGENT, layer).inc()  # noqa: E731
    outbox.deliver(tp, offset, sends, [counted, *then])


@dataclass(eq=False)
class _Pending:
    """A poison message this worker dead-letters: asked for on the outcomes topic, then sent (once)."""

    dead_letter: Callable[[float | None], None]  # given when an earlier owner may have sent it (see on_request)
    done: asyncio.Future[None]  # done once the dead letter is confirmed (or it is no longer this worker's to send)
    sending: bool = False


class Poison:
    """The poison messages this worker is dead-lettering, until their marker is written.

    The dead letter is asked for through the app's outcomes topic, on the message's partition; the marker then
    says ``sending`` (in the changelog before the dead letter goes) and, once it is confirmed, ``done`` (from the
    ``dead_lettered`` event). docs/decisions.md ("One dead letter per poison message") tells why.
    """

    def __init__(self, table: KeyedTable, outbox: Outbox, outcomes: str, worker_id: str) -> None:
        self.table = table
        self.outbox = outbox
        self.outcomes = outcomes
        self.worker_id = worker_id
        self._pending: dict[tuple[TP, int], _Pending] = {}

    def dead_lettering(self) -> list[tuple[TP, int]]:
        """The (partition, offset) of each poison message this worker is dead-lettering now."""
        return list(self._pending)

    def on_message(
        self, tp: TP, offset: int, agent: str, key: bytes | None, value: bytes | None, headers: object,
        poison: PoisonMessage,
    ) -> None:
        """A task message no agent can use: one dead letter, also when it is delivered again.

        A marker in the task table answers a redelivery. It is asked for through the outcomes topic, on the
        message's partition, so a dead owner's ``dead_lettered`` event there is read before this request.
        """
        marker = poison_key(tp.topic, offset)
        if self.marker(marker) == DONE:
            log.info("%s[%d]@%d was dead-lettered before; not again", tp.topic, tp.partition, offset)
            return
        pending = self._pending.get((tp, offset))
        if pending is not None:
            log.info("%s[%d]@%d is being dead-lettered already; not again", tp.topic, tp.partition, offset)
            held = pending.done
            self.outbox.deliver(tp, offset, [lambda: held])
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        _, history = requeue_headers(headers)
        extra = [(HISTORY_HEADER, history.encode("utf-8"))] if history else []

        def dead_letter(sent_since: float | None) -> None:
            log.warning(
                "Dead-lettering %s[%d]@%d: %s (layer 1; see %s)",
                tp.topic, tp.partition, offset, poison, topics.dlq_topic(agent),
            )
            send_dead_letter(
                self.outbox, Unreadable(tp, offset, key, value), agent=agent, reason=reason_of(poison), headers=extra,
                sent_since=sent_since, then=[lambda: self.outbox.retrying(self._mark(tp, marker, done))],
            )

        self._pending[(tp, offset)] = _Pending(dead_letter, done)
        # The offset is held until the dead letter is confirmed (``done``), whoever's request acts.
        request = self.outbox.record(self.outcomes, marker.encode(), DEAD_LETTER_REQUEST, partition=tp.partition)
        self.outbox.deliver(tp, offset, [request, lambda: done])

    def on_request(self, tp: TP, offset: int, marker: str) -> None:
        """This worker's request to dead-letter a poison message came back (see on_message).

        The marker first says the dead letter is being sent (``sending``), and the dead letter goes once that
        is in the changelog. A worker that then died before its ``dead_lettered`` event leaves that state to the
        next owner, whose dead letter looks on the topic before it is sent.
        """
        source = poison_source(marker, tp.partition)
        pending = self._pending.get(source) if source else None
        if source is None or pending is None or pending.sending:
            return  # asked by a worker that died before acting (its message came here and asks again), or a repeat
        state = self.marker(marker)
        if state == DONE:
            log.info(
                "%s[%d]@%d was dead-lettered by another worker before; not again", source[0].topic, tp.partition,
                source[1],
            )
            self._release(source)
            return
        pending.sending = True
        if state is not None:  # begun by an owner that stopped before it was marked: it may be on the topic
            pending.dead_letter(float(state))
            return
        self.table[marker] = json.dumps({"sending": time.time(), "by": self.worker_id})
        written = self.outbox.changelog(self.table, tp.partition, marker)
        self.outbox.deliver(tp, offset, [written], [lambda: pending.dead_letter(None)])

    def on_marked(self, tp: TP, offset: int, marker: str) -> None:
        """A poison message's dead letter is confirmed (``dead_lettered``, ours or another's): remember it."""
        self._release(poison_source(marker, tp.partition))
        self.table[marker] = json.dumps({"at": time.time()})
        self.outbox.deliver(tp, offset, [self.outbox.changelog(self.table, tp.partition, marker)])

    def marker(self, marker: str) -> str | float | None:
        """A poison message's marker: None, DONE, or when an owner began its dead letter (``sending``)."""
        data = self.table.get(marker)
        if not data:
            return None
        sending = json.loads(data).get("sending")
        return DONE if sending is None else float(sending)

    def forget(self, tps: set[TP]) -> None:
        """Partitions revoked: a dead letter not asked for yet is the next owner's to ask for."""
        for source, pending in list(self._pending.items()):
            if source[0] not in tps or (pending.sending and not pending.done.done()):
                continue  # a dead letter on its way is waited for if the partition comes back (see on_message)
            self._release(source)  # its hold here is gone with the partition

    async def _mark(self, tp: TP, marker: str, done: asyncio.Future[None]) -> None:
        """A poison message's dead letter is confirmed: send its ``dead_lettered`` event (the ledger writes the
        marker when it reads it) until the broker has it; only then is its offset released (``done``)."""
        try:
            await self.outbox.send_confirmed(
                self.outcomes, marker.encode(), MARK_EVENT, partition=tp.partition,
                what=f"the dead_lettered event of {tp.topic}:{tp.partition}", subject=marker.lstrip("\x00"),
            )
        finally:
            if not done.done():
                done.set_result(None)

    def _release(self, source: tuple[TP, int] | None) -> None:
        """This worker no longer dead-letters ``source`` (its marker is written, or it is another worker's now):
        forget it and release the offset hold that waits for it."""
        pending = self._pending.pop(source, None) if source is not None else None
        if pending is not None and not pending.done.done():
            pending.done.set_result(None)
