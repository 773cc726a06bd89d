"""Direct sends: records handed to aiokafka's batches from the caller's own stack, without Faust's producer buffer.

Faust's ``send_soon`` puts each record in its producer buffer, whose one task takes them out one at a time and
awaits Faust's ``publish_message`` for each (a ``FutureMessage``, its sensors, a callback): about 0.3 ms of CPU a
record on a 2-core host, three records a task. aiokafka's ``send`` itself only appends the record to the batch of
its partition, which its sender sends at once while no request to that broker is in flight, and with the next ones
gathered behind it otherwise; it waits only for a topic's first metadata or for a full batch to drain. A direct
send runs that ``send`` on the caller's stack; the rare one that must wait finishes in a task, and every record of
its topic after it queues behind it, so the records of a partition keep the order they were sent in
(docs/decisions.md, "Direct changelog sends"; the runs alternated with Faust's path are in bench/notes.md).

A topic's records must all go one way, all direct or all through Faust's buffer: two paths would not keep their
order. Every record this app sends goes this way: the ledger's tables send their changelog records
(``tables/definitions.py``), and every topic of raw keys and values (all of the app's own, from results and outcomes to
conversation events and dead letters) sends its ``send_soon`` here (``kafka.delivery.GuardedTopic``).

A record of a topic that carries no promise anyone waits for (the control events, the breakers' events: ``riders``)
rides with the next other record: it is held until a send of another topic, or ``RIDE_S`` at most, and then goes
just ahead of it. aiokafka keeps one produce request in flight per broker: a control event sent alone took that
slot, and the journal entry a run waited for, sent a moment later, waited a whole round trip behind it. Held, the
event goes in the entry's own request. Every record still leaves in the order it was sent: the held ones are
released before any other send (docs/decisions.md, "Riders").

Before the producer has started, and after it stopped, no record goes to aiokafka: Faust makes a new aiokafka
producer as it starts, and a record appended to one made earlier would never leave. A send before the start waits
for it (``START_WAIT_S`` at most) with every record of its topic behind it, as Faust's buffer held them; a send after
the stop fails at once (its sender retries it: the outbox holds its offset).
"""

from __future__ import annotations

import asyncio
import types
from collections import deque
from typing import Any, Callable, Coroutine, Generator

from aiokafka.errors import KafkaTimeoutError

from agents_stream.background import Background
from agents_stream.kafka.delivery import log_undeliverable, undeliverable
from agents_stream.tables.writes import chain

__all__ = ["MAX_QUEUED", "RIDE_S", "START_WAIT_S", "DirectSends"]

#: one record's send: topic, key, value, partition, headers
_Record = tuple[str, "bytes | None", "bytes | None", "int | None", "list[tuple[str, bytes]] | None"]


#: records of one topic queued behind a send that waits, before the next ones fail at once (their senders retry
#: them: the outbox holds their offsets); aiokafka's own batch of a partition holds what it sends next
MAX_QUEUED = 10_000
#: how long a rider waits for another record to go with before it goes alone
RIDE_S = 0.005
#: how long a send made before the producer started waits for it before it fails (its sender retries it)
START_WAIT_S = 60.0


class DirectSends:
    """Sends records straight into aiokafka's batches; each send's future settles with the broker's answer.

    ``producer()`` is the aiokafka producer now (Faust's producer makes it on its first use); ``track(topic)``
    is called before each send (the producer's metadata tracking). A send that must wait (its topic's first
    metadata, a full batch) is finished by a task of this object's, held in ``tasks``; every record of its topic
    sent meanwhile queues behind it, in order. Other topics go on: one topic's wait holds no other's records.

    ``running`` says the producer may be sent to: set by its owner once the producer started (``started=False``
    makes sends wait for that), cleared by ``stop``. A record of a topic in ``riders`` is held until the next send
    of another topic, or ``RIDE_S`` at most, and goes just ahead of it."""

    def __init__(
        self, producer: Callable[[], Any], track: Callable[[str], None], *, started: bool = True,
        riders: frozenset[str] = frozenset(),
    ) -> None:
        self.producer = producer
        self.track = track
        self.running = asyncio.Event()
        if started:
            self.running.set()
        self.stopped = False
        self.tasks = Background("direct sends waiting for the producer")
        #: per topic with a send waiting, the records queued behind it
        self._queued: dict[str, deque[tuple[_Record, asyncio.Future[Any]]]] = {}
        self.riders = riders
        #: riders held for the next other record, in the order they were sent; and the timer that sends them alone
        self._riding: list[tuple[_Record, asyncio.Future[Any]]] = []
        self._ride_timer: asyncio.TimerHandle | None = None

    def send(
        self, topic: str, key: bytes | None, value: bytes | None, *, partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[Any]:
        """Send one record; the future settles with its RecordMetadata once the broker confirmed it, or with the
        producer's error. A record the producer refuses at once fails at once: too large, as RecordTooLarge (and
        operators read what to do), as Faust's path does (``GuardedTopic``)."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()
        record = (topic, key, value, partition, headers)
        if topic in self.riders and not self.stopped:
            self._riding.append((record, answer))
            if self._ride_timer is None:
                self._ride_timer = loop.call_later(RIDE_S, self.release)
            return answer
        if self._riding:
            self.release()
        self._send(record, answer)
        return answer

    def release(self) -> None:
        """Send the held riders now, in order (another record goes next, or they waited ``RIDE_S``)."""
        if self._ride_timer is not None:
            self._ride_timer.cancel()
            self._ride_timer = None
        riding, self._riding = self._riding, []
        for record, answer in riding:
            self._send(record, answer)

    def _send(self, record: _Record, answer: asyncio.Future[Any]) -> None:
        topic = record[0]
        queue = self._queued.get(topic)
        if queue is not None:
            if len(queue) >= MAX_QUEUED:
                answer.set_exception(KafkaTimeoutError(
                    f"{MAX_QUEUED} records for {topic} already wait for the producer; this one is not queued (its "
                    "sender retries it)"))
            else:
                queue.append((record, answer))
            return
        if not self.running.is_set():
            if self.stopped:
                answer.set_exception(_stopped())
                return
            self._queued[topic] = deque()  # the records of this topic sent meanwhile queue behind this one
            self.tasks.start(self._finish(topic, self._once_running(record), None, answer))
            return
        try:
            coro = self._start(record)
            blocked_on = coro.send(None)
        except StopIteration as done:  # appended to its batch: the usual case
            chain(done.value, answer)
            return
        except Exception as exc:  # the producer refused it at once (too large, not running)
            permanent = undeliverable(exc)
            if permanent is not None:
                log_undeliverable(topic, permanent)
            answer.set_exception(permanent or exc)
            return
        self._queued[topic] = deque()
        self.tasks.start(self._finish(topic, coro, blocked_on, answer))

    def _start(self, record: _Record) -> Coroutine[Any, Any, Any]:
        if not self.running.is_set():
            raise _stopped()
        topic, key, value, partition, headers = record
        self.track(topic)
        return self.producer().send(topic, value=value, key=key, partition=partition, headers=headers)

    async def _once_running(self, record: _Record) -> Any:
        try:
            await asyncio.wait_for(self.running.wait(), START_WAIT_S)
        except asyncio.TimeoutError:
            raise ConnectionError(f"the producer did not start within {START_WAIT_S:.0f}s; this record was not sent "
                                  "(its sender retries it)") from None
        return await self._start(record)

    async def _finish(
        self, topic: str, coro: Coroutine[Any, Any, Any], blocked_on: Any, answer: asyncio.Future[Any],
    ) -> None:
        """Finish the send that had to wait (``coro`` run by hand up to ``blocked_on``, or not started yet: None),
        then send the records of its topic queued behind it, one at a time."""
        queue = self._queued[topic]
        try:
            try:
                chain(await (coro if blocked_on is None else _resumed(coro, blocked_on)), answer)
            except Exception as exc:
                _fail(answer, exc)
            while queue:
                record, answer = queue[0]
                try:
                    chain(await self._start(record), answer)
                except Exception as exc:
                    _fail(answer, exc)
                queue.popleft()
        except asyncio.CancelledError:  # stopping: nothing queued goes out any more; its senders see why
            stopped = _stopped()
            _fail(answer, stopped)
            for _, queued in queue:
                _fail(queued, stopped)
            raise
        finally:
            del self._queued[topic]

    async def stop(self) -> None:
        """Send the held riders; cancel the sends still waiting: the records queued behind them fail, and so does
        every send from now on."""
        self.release()
        self.stopped = True
        self.running.clear()
        await self.tasks.stop()


@types.coroutine
def _resumed(coro: Coroutine[Any, Any, Any], blocked_on: Any) -> Generator[Any, Any, Any]:
    """Go on with ``coro``, which was run by hand until it first waited on ``blocked_on``: the task that awaits
    this waits on what ``coro`` waits on, and passes its answers (and a cancel) on to it."""
    while True:
        try:
            sent = yield blocked_on
        except BaseException as exc:
            try:
                blocked_on = coro.throw(exc)
            except StopIteration as done:
                return done.value
        else:
            try:
                blocked_on = coro.send(sent)
            except StopIteration as done:
                return done.value


def _stopped() -> ConnectionError:
    return ConnectionError("the producer is not running (it stopped, or never started) and this record was not sent; "
                           "its sender retries it")


def _fail(answer: asyncio.Future[Any], exc: BaseException) -> None:
    if not answer.done():
        answer.set_exception(exc)
