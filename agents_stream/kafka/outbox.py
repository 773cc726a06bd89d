"""The outbox: every record, changelog write and dead letter an event starts, held in the watermark until confirmed."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine, Iterable, Protocol

import mode
from faust.types import TP

from agents_stream.background import Background
from agents_stream.contract import topics
from agents_stream.contract.errors import Fenced
from agents_stream.contract.models import ControlEvent, utcnow_iso
from agents_stream.kafka.deadletters import FindDeadLetter
from agents_stream.kafka.delivery import (
    CONFIRM_TIMEOUT_S,
    RecordTooLarge,
    Send,
    SendRefused,
    TopicCheck,
    Undeliverable,
    is_confirmed,
    retry_delay,
    until_confirmed,
)
from agents_stream.kafka.watermark import Watermark

__all__ = ["Channel", "ChangelogTable", "Headers", "Outbox", "Send"]

log = logging.getLogger(__name__)

#: how often a confirmed delivery whose worker the group has not confirmed lately looks again
MEMBER_POLL_S = 0.2
#: how long it waits for the group to confirm this worker before its follow-ups are dropped as fenced
MEMBER_WAIT_S = 60.0

Headers = list[tuple[str, bytes]]


class Channel(Protocol):
    """Where records of one topic go (a Faust topic with raw key and value serializers)."""

    def send_soon(
        self, *, key: bytes | None, value: bytes | None, partition: int | None = None, headers: Any = None,
    ) -> "asyncio.Future[Any]": ...


class ChangelogTable(Protocol):
    """A table that keeps the future of its last changelog send (agents_stream.tables.definitions.LedgerTable)."""

    last_changelog: Any

    def get(self, key: str) -> Any: ...

    def send_changelog(self, partition: int, key: str, value: Any) -> Any: ...


@dataclass(eq=False)
class _Delivery:
    """The sends one event started, on their way to the broker; its offset is held until all are confirmed."""

    tp: TP
    offset: int
    gen: int  # the watermark generation of its hold
    sends: list[Send]
    started: list[Any]
    after: list[Callable[[], object]]
    #: ``after`` runs only while the partition is this worker's (see ``Outbox.deliver``); else ``fenced`` does
    fence: bool = False
    fenced: Callable[[], object] | None = None
    left: int = 0
    timer: asyncio.TimerHandle | None = None
    concluded: bool = False
    member_by: float = 0.0  # waiting for the group to confirm this worker: fenced after this (monotonic)


@dataclass
class _DeadLetterAttempts:
    """Every attempt of one dead letter so far, and the records among them actually sent."""

    tried: list["asyncio.Future[Any]"] = field(default_factory=list)
    sent: list["asyncio.Future[Any]"] = field(default_factory=list)


class Outbox(mode.Service):
    """Sends records and holds each event's offset until the broker confirmed every send it started.

    So the committed offset never passes an outcome that is not durable. The common case costs no task (a
    callback per send); a send that failed or had no answer in time is retried by a task. A dead letter that may
    be on its topic already is looked for there before it is sent again (docs/decisions.md, "One dead
    letter per poison message").

    ``channel(topic)`` gives the producer of a topic; ``find_dead_letter`` looks on a dead-letter topic
    (agents_stream.kafka.deadletters.dead_letter_finder; tests pass their own). Its retry tasks are its own:
    stopping it cancels them, and the offsets of deliveries still pending stay held.
    """

    def __init__(
        self,
        channel: Callable[[str], Channel],
        watermark: Watermark,
        worker_id: str,
        *,
        find_dead_letter: FindDeadLetter,
        confirm_timeout_s: float = CONFIRM_TIMEOUT_S,
        retry_delay: Callable[[int], float] = retry_delay,
        member: Callable[[], bool] = lambda: True,
        member_wait_s: float = MEMBER_WAIT_S,
        topics: TopicCheck | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.channel = channel
        self.watermark = watermark
        #: the group confirmed this worker as a member lately (Runtime.member): see ``deliver``
        self.member = member
        self._member_waiting: list[_Delivery] = []  # confirmed, waiting for the group to confirm this worker
        self.member_wait_s = member_wait_s
        #: topics the producer does not know are looked up before a record for them is sent (None: not checked)
        self.topics = topics
        self.worker_id = worker_id
        self.find_dead_letter = find_dead_letter
        self.confirm_timeout_s = confirm_timeout_s
        self.retry_delay = retry_delay
        self._channels: dict[str, Channel] = {}
        self._pending: set[_Delivery] = set()  # deliveries waiting on the broker (callbacks, no task)
        self._retries = Background("outbox retries")  # deliveries being retried, and dead-letter lookups

    # -- sends ---------------------------------------------------------------------------------------

    def send(
        self, topic: str, key: bytes | None, value: bytes | None, *, partition: int | None = None,
        headers: Any = None,
    ) -> "asyncio.Future[Any]":
        """One attempt: start sending the record now; the future is the broker's answer. A topic the producer
        does not know yet is looked up first, off Faust's producer buffer (``TopicCheck``)."""
        if self.topics is not None and not self.topics.known(topic):
            return self.retrying(self._send_checked(topic, key, value, partition, headers))
        channel = self._channels.get(topic)
        if channel is None:
            channel = self._channels[topic] = self.channel(topic)
        return channel.send_soon(key=key, value=value, partition=partition, headers=headers)

    async def _send_checked(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None, headers: Any,
    ) -> Any:
        assert self.topics is not None
        if not await self.topics.exists(topic):
            raise SendRefused(f"topic {topic} does not exist")
        channel = self._channels.get(topic)
        if channel is None:
            channel = self._channels[topic] = self.channel(topic)
        return await channel.send_soon(key=key, value=value, partition=partition, headers=headers)

    def record(
        self, topic: str, key: bytes | None, value: bytes | None, *, partition: int | None = None,
        headers: Any = None,
    ) -> Send:
        """The send of one record (each call of it is one attempt), for ``deliver``."""
        return lambda: self.send(topic, key, value, partition=partition, headers=headers)

    def changelog(self, table: ChangelogTable, partition: int, key: str) -> Send:
        """The send of the write just made to ``table[key]``: the table's own changelog send first; a retry
        re-sends the key's current value (idempotent in a compacted changelog)."""
        pending = [table.last_changelog]

        def send() -> Any:
            if pending:
                return pending.pop()
            return table.send_changelog(partition, key, table.get(key))

        return send

    def control(self, event: str, subject: str, agent: str | None, details: dict[str, Any]) -> None:
        """Publish a control event (best effort: losing one loses no work, so it holds no offset)."""
        record = ControlEvent(event=event, subject=subject, agent_name=agent, worker=self.worker_id, details=details)
        fut = self.send(topics.CONTROL, subject.encode("utf-8"), record.model_dump_json().encode())
        fut.add_done_callback(_log_control_failure)

    async def send_confirmed(
        self, topic: str, key: bytes | None, value: bytes | None, *, partition: int | None = None, what: str,
        subject: str,
    ) -> None:
        """Send a record and retry it until the broker confirms it (an alert about ``subject`` if that lasts)."""
        await until_confirmed(
            self.record(topic, key, value, partition=partition),
            what=what,
            alert=lambda exc: self.control("alert.broker_send_failing", subject, None, {"error": repr(exc)}),
            timeout=self.confirm_timeout_s,
            delay=self.retry_delay,
        )

    # -- dead letters --------------------------------------------------------------------------------

    def dead_letter(
        self, source: TP, offset: int, key: bytes | None, value: bytes | None, *, agent: str, reason: str,
        layer: str, attempts: int, headers: Iterable[tuple[str, bytes]] = (), topic: str | None = None,
        sent_since: float | None = None,
    ) -> Send:
        """The send of one dead letter of the message at ``source``@``offset`` (docs/contract.md, its headers).

        Its retries (and its first attempt too when ``sent_since`` says an earlier owner may have sent it since
        then) look on the topic first and send only if it is not there.
        """
        record_headers = [
            ("error_reason", reason.encode("utf-8")),
            ("error_layer", layer.encode()),
            ("original_topic", source.topic.encode()),
            ("original_partition", str(source.partition).encode()),
            ("original_offset", str(offset).encode()),
            ("failed_at", utcnow_iso().encode()),
            ("attempts", str(attempts).encode()),
            *headers,
        ]
        target = topic or topics.dlq_topic(agent)
        where = (source.topic, source.partition, offset)
        since = time.time() if sent_since is None else sent_since
        so_far = _DeadLetterAttempts()

        def put() -> "asyncio.Future[Any]":
            fut = self.send(target, key, value, headers=record_headers)
            so_far.sent.append(fut)
            return fut

        def send() -> "asyncio.Future[Any]":
            if not so_far.tried and sent_since is None:
                fut = put()
            else:
                fut = self.retrying(self._unless_there(list(so_far.tried), so_far.sent, target, where, since, put))
            so_far.tried.append(fut)
            return fut

        return send

    async def _unless_there(
        self, tried: list["asyncio.Future[Any]"], sent: list["asyncio.Future[Any]"], dlq: str,
        source: tuple[str, int, int], since: float, put: Send,
    ) -> Any:
        """One attempt of a dead letter that may be on the topic already: wait for the attempts before (an
        unanswered send may still land), look for it (``find_dead_letter``), and send it only if it is not there."""
        waiting = [f for f in (*tried, *sent) if not f.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=self.confirm_timeout_s)
        landed = next((f for f in sent if is_confirmed(f)), None)
        if landed is not None:
            return landed.result()
        found = await self.find_dead_letter(dlq, source, since)
        if found is not None:
            log.info("The dead letter of %s[%d]@%d is on %s already (%s); not sent again", *source, dlq, found.ref)
            return found
        fut = put()
        await asyncio.wait((fut,), timeout=self.confirm_timeout_s)
        if not fut.done():
            raise TimeoutError(f"no answer from the broker within {self.confirm_timeout_s:.0f}s")
        return fut.result()

    # -- holding offsets until confirmed -------------------------------------------------------------

    def deliver(
        self, tp: TP, offset: int, sends: list[Send], after: Iterable[Callable[[], object]] = (), *,
        fence: bool = False, fenced: Callable[[], object] | None = None,
    ) -> None:
        """Hold ``offset`` open until every send is confirmed, then run ``after``.

        The common case costs no task: a callback on each send's future counts them down (two deliveries per
        task, so this is on the hot path). A send that failed, or had no answer within the confirm timeout,
        hands the delivery to a task that retries it.

        ``fence`` (a task's transition, ledger/effects.py): ``after`` runs only if ``tp`` is still this worker's
        (not revoked since) and the group confirmed this worker as a member within half a session timeout when
        the last confirmation came. Then every record sent landed before the group could give ``tp`` to another
        worker, so its next owner recovers them: what ``after`` starts (a dispatch, a tool call on a journal
        entry, a result) acts on state the next owner sees. Otherwise ``fenced`` runs instead and the sends are no
        longer retried (docs/security.md, "Fencing"). Without ``fence`` (a poison message's dead letter, whose
        own markers make it one per message across owners) the follow-ups run once the sends are confirmed.
        """
        gen = self.watermark.open(tp, offset)
        delivery = _Delivery(tp, offset, gen, sends, [send() for send in sends], list(after), fence, fenced)
        waiting = [f for f in delivery.started if not f.done()]
        if not waiting:
            self._conclude(delivery)
            return
        delivery.left = len(waiting)
        delivery.timer = asyncio.get_running_loop().call_later(self.confirm_timeout_s, self._conclude, delivery)
        self._pending.add(delivery)
        for fut in waiting:
            fut.add_done_callback(lambda _, d=delivery: self._answered(d))

    def _answered(self, delivery: _Delivery) -> None:
        delivery.left -= 1
        if delivery.left == 0:
            self._conclude(delivery)

    def _conclude(self, delivery: _Delivery) -> None:
        """Every send of ``delivery`` answered (or the timeout came): release its offset, or retry in a task."""
        if delivery.concluded:
            return
        delivery.concluded = True
        self._pending.discard(delivery)
        if delivery.timer is not None:
            delivery.timer.cancel()
        if all(is_confirmed(f) for f in delivery.started):
            if delivery.fence:
                self._confirmed(delivery)
            else:
                self._follow_up(delivery)
            return
        self.retrying(self._confirm(delivery))

    def _confirmed(self, delivery: _Delivery) -> None:
        """Every send of ``delivery`` is confirmed: its follow-ups, if the partition is still this worker's."""
        if self.watermark.generation(delivery.tp) != delivery.gen:
            self._fence(delivery, "its partition was revoked before the broker confirmed its writes")
        elif not self.member():
            self._once_member(delivery)
        else:
            self._follow_up(delivery)

    def _follow_up(self, delivery: _Delivery) -> None:
        tp, offset = delivery.tp, delivery.offset
        try:
            for fn in delivery.after:
                fn()
        except Exception as exc:  # a bug in a follow-up must not hold the offset forever
            log.exception(
                "A follow-up of %s[%d]@%d failed after its sends were confirmed: %r",
                tp.topic, tp.partition, offset, exc,
            )
        finally:
            self.watermark.close(tp, offset, delivery.gen)

    def _once_member(self, delivery: _Delivery) -> None:
        """Confirmed while the group had not confirmed this worker lately (a commit round failed or was slow, the
        worker was paused or cut off): its follow-ups wait until it does, or are fenced once the partition is
        revoked or ``member_wait_s`` passed. One loop looks for all of them (a burst can hold thousands)."""
        delivery.member_by = time.monotonic() + self.member_wait_s
        self._member_waiting.append(delivery)
        if len(self._member_waiting) == 1:
            self.retrying(self._release_members())

    async def _release_members(self) -> None:
        while self._member_waiting:
            await asyncio.sleep(MEMBER_POLL_S)
            member, now = self.member(), time.monotonic()
            waiting, self._member_waiting = self._member_waiting, []
            for d in waiting:
                revoked = self.watermark.generation(d.tp) != d.gen
                if not revoked and member:
                    self._follow_up(d)
                elif revoked or now >= d.member_by:
                    self._fence(d, "the group did not confirm this worker as a member before its partition was "
                                "revoked" if revoked else
                                f"the group did not confirm this worker as a member within {self.member_wait_s:.0f}s")
                    self.watermark.close(d.tp, d.offset, d.gen)
                else:
                    self._member_waiting.append(d)

    def _fence(self, delivery: _Delivery, why: str) -> None:
        """The follow-ups of ``delivery`` are not run: this worker may no longer act for its partition."""
        tp = delivery.tp
        if delivery.after or delivery.fenced is not None:
            log.warning(
                "The writes of %s[%d]@%d are fenced, not acted on here (%s); the partition's owner recovers the "
                "task from the changelog and carries it on. Nothing to do unless this repeats (then check this "
                "worker's connection to the brokers and its pauses)", tp.topic, tp.partition, delivery.offset, why,
            )
        if delivery.fenced is not None:
            try:
                delivery.fenced()
            except Exception as exc:  # a bug there must not stop the others
                log.exception("A fenced delivery's callback failed: %r", exc)

    async def _confirm(self, delivery: _Delivery) -> None:
        """Retry ``delivery`` until the broker confirms every send: a failed send from its error, one with no
        answer yet sent again now; then run its follow-ups and release its offset. Not while its partition is
        revoked: then nothing is sent again and the follow-ups are fenced (``deliver``)."""
        tp, offset = delivery.tp, delivery.offset
        where = f"{tp.topic}:{tp.partition}:{offset}"
        release = True
        try:
            for send, fut in zip(delivery.sends, delivery.started, strict=True):
                await until_confirmed(
                    send,
                    what=f"the effects of {where}",
                    alert=lambda exc: self.control("alert.broker_send_failing", where, None, {"error": repr(exc)}),
                    first=fut if fut.done() else None,  # not done by now: it had no answer in time
                    timeout=self.confirm_timeout_s,
                    delay=self.retry_delay,
                    still_mine=lambda: not delivery.fence or self.watermark.generation(tp) == delivery.gen,
                )
            if not delivery.fence:
                for fn in delivery.after:
                    fn()
            elif self.watermark.generation(tp) == delivery.gen and not self.member():
                release = False  # _once_member releases it
                self._once_member(delivery)
            elif self.watermark.generation(tp) != delivery.gen:
                self._fence(delivery, "its partition was revoked before the broker confirmed its writes")
            else:
                for fn in delivery.after:
                    fn()
        except asyncio.CancelledError:
            release = False  # the consumer commits once more as it stops: this offset must still hold it back
            raise
        except Fenced:
            self._fence(delivery, "its partition was revoked while its writes were retried")
        except Undeliverable as exc:
            # No retry can send it (too large, or refused: an invalid topic, no authorization), and holding the
            # offset would stall the partition forever: the offset is released and operators told. The ledger
            # bounds what it writes and checks the topics a task names, so this is the last resort.
            large = isinstance(exc, RecordTooLarge)
            log.error(
                "A send of %s can never be confirmed: %s. Its offset is released without it; %s", where, exc,
                "bound what grows the record or raise AGENTS_STREAM_RECORD_MAX_BYTES and the topics' "
                "max.message.bytes" if large else "grant the worker Write on the topic if it is one of this app's",
            )
            alert = "alert.record_too_large" if large else "alert.send_refused"
            self.control(alert, where, None, {"error": str(exc)[:500]})
        finally:
            if release:
                self.watermark.close(tp, offset, delivery.gen)

    # -- background tasks ----------------------------------------------------------------------------

    def retrying(self, coro: Coroutine[Any, Any, Any]) -> "asyncio.Task[Any]":
        """Run ``coro`` as one of the outbox's retry tasks (cancelled at stop, counted by ``delivering``)."""
        return self._retries.start(coro)

    def delivering(self) -> int:
        """Deliveries not yet confirmed by the broker (their offsets are held open), and retry tasks."""
        return len(self._pending) + len(self._retries)

    async def on_stop(self) -> None:
        """Drop deliveries still pending: their offsets were never committed, so nothing is lost."""
        for delivery in list(self._pending):  # their offsets stay held: nothing after them is committed
            delivery.concluded = True
            if delivery.timer is not None:
                delivery.timer.cancel()
        self._pending.clear()
        await self._retries.stop()


def _log_control_failure(fut: "asyncio.Future[Any]") -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.warning("A control event was not delivered: %r (no work is affected)", fut.exception())
