"""The stand-ins the ledger's unit tests share: a table whose writes are confirmed at once, an outbox whose
sends are kept and confirmed at once, the runs the ledger starts and stops (``FakeRuns``), and the Faust event the
ledger handles."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from agents_stream.tables.definitions import Tables
from agents_stream.tables.leases import TaskRecord
from faust.types import TP

from agents_stream.contract.events import CachedAnswer, JournalEntry, StepDone, TaskFailed, TaskSucceeded
from agents_stream.contract.models import TaskPayload
from agents_stream.kafka.outbox import Outbox
from agents_stream.kafka.watermark import Watermark
from agents_stream.ledger.app_agents import AppAgents
from agents_stream.ledger.ledger import Ledger
from agents_stream.ops.notify import Notifier
from agents_stream.settings import Settings

Lookup = Callable[[str, tuple[str, int, int], float], Awaitable[Any]]

#: the Kafka timestamp (seconds) of every record ``event`` makes unless told: 2026-12-01T10:00:00Z
EVENT_TIMESTAMP = 1796119200.0


@dataclass(frozen=True)
class FaustMessage:
    """What the ledger reads of a Faust event's message: where the record is, its headers and its timestamp."""

    tp: TP
    topic: str
    offset: int
    headers: list[Any]
    timestamp: float | None


@dataclass(frozen=True)
class FaustEvent:
    """What the ledger reads of a Faust event (``Ledger.handle``): its message, key and value."""

    message: FaustMessage
    key: bytes | None
    value: bytes | None


def faust_event(
    tp: TP, offset: int, key: bytes | None, value: bytes | None, *, timestamp: float | None = EVENT_TIMESTAMP,
    headers: Any = (),
) -> FaustEvent:
    """A Faust event of the record at ``tp``@``offset``, with what of it the ledger reads."""
    return FaustEvent(FaustMessage(tp, tp.topic, offset, list(headers), timestamp), key, value)


@dataclass
class ConfirmingChannel:
    """One topic as the outbox sends to it (``kafka.outbox.Channel``): each send is given to ``sent`` as (topic,
    key, value, headers) and confirmed by the broker at once."""

    topic: str
    sent: Callable[[str, bytes | None, bytes | None, Any], object] = lambda topic, key, value, headers: None

    def send_soon(
        self, *, key: bytes | None, value: bytes | None, partition: int | None = None, headers: Any = None,
    ) -> asyncio.Future[Any]:
        self.sent(self.topic, key, value, headers)
        confirmed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        confirmed.set_result("ok")
        return confirmed


class NoRuns:
    """The runs of a worker whose executor the test expects the ledger never to use (``Runs``): any use fails."""

    @property
    def worker_id(self) -> str:
        raise AssertionError("the ledger asked for its executor's worker id")

    def has(self, task_id: str) -> bool:
        raise AssertionError(f"the ledger asked whether {task_id} runs here")

    def dispatch(
        self, task: TaskPayload, dispatch: int, steps_done: list[Any] | None = None, trace: str | None = None,
    ) -> None:
        raise AssertionError(f"the ledger dispatched {task.task_id}")

    def cancel(self, task_id: str) -> None:
        raise AssertionError(f"the ledger cancelled {task_id}")

    def interrupt(self, task_id: str) -> None:
        raise AssertionError(f"the ledger interrupted {task_id}")

    def cache_answer(self, task_id: str, answer: CachedAnswer | None) -> None:
        raise AssertionError(f"the ledger answered a cache lookup of {task_id}")


class Dispatched(NamedTuple):
    """One ``Runs.dispatch`` the ledger asked for."""

    task: TaskPayload
    dispatch: int
    steps_done: list[Any] | None
    trace: str | None


@dataclass
class FakeRuns:
    """The runs of a worker as the ledger sees them (``agents_stream.ledger.runs.Runs``), keeping what it asks:
    no run is here but those in ``here``; ``on_dispatch`` sees each dispatch as it is asked for."""

    worker_id: str = "w1"
    here: set[str] = field(default_factory=set)
    dispatched: list[Dispatched] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)
    cached: list[tuple[str, CachedAnswer | None]] = field(default_factory=list)
    on_dispatch: Callable[[Dispatched], None] | None = None

    def has(self, task_id: str) -> bool:
        return task_id in self.here

    def dispatch(
        self, task: TaskPayload, dispatch: int, steps_done: list[Any] | None = None, trace: str | None = None,
    ) -> None:
        asked = Dispatched(task, dispatch, steps_done, trace)
        self.dispatched.append(asked)
        if self.on_dispatch is not None:
            self.on_dispatch(asked)

    def cancel(self, task_id: str) -> None:
        self.cancelled.append(task_id)

    def interrupt(self, task_id: str) -> None:
        self.interrupted.append(task_id)

    def cache_answer(self, task_id: str, answer: CachedAnswer | None) -> None:
        self.cached.append((task_id, answer))


class PlainTable(dict[str, Any]):
    """A table as the ledger's parts use it (tables.definitions.ScannedTable), for tests that only read it or write
    it outside the event loop: its writes leave no changelog future. It has no local store: a scan finds nothing,
    as LedgerTable's does for a partition it has no database for."""

    last_changelog: asyncio.Future[Any] | None = None

    def get(self, key: str, default: Any = None, /) -> Any:
        return super().get(key, default)

    def send_changelog(self, partition: int, key: str, value: Any, /) -> asyncio.Future[Any]:
        """A retried changelog send (Outbox.changelog): confirmed at once."""
        sent: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        sent.set_result("ok")
        return sent

    def scan(self, partition: int, after: bytes | None, limit: int, /) -> tuple[list[tuple[str, Any]], bytes | None]:
        return [], None


class Table(PlainTable):
    """A table as the ledger writes it: each write or delete leaves a changelog future, confirmed at once."""

    def __setitem__(self, key: str, value: Any, /) -> None:
        super().__setitem__(key, value)
        self._confirmed()

    def __delitem__(self, key: str, /) -> None:
        super().__delitem__(key)
        self._confirmed()

    def _confirmed(self) -> None:
        self.last_changelog = asyncio.get_running_loop().create_future()
        self.last_changelog.set_result("ok")


async def _no_dead_letter(dlq: str, source: tuple[str, int, int], since: float) -> None:
    return None


def recording_outbox(
    find_dead_letter: Lookup = _no_dead_letter, member: Callable[[], bool] = lambda: True,
) -> tuple[Outbox, list[tuple[str, bytes | None]]]:
    """An outbox whose sends are kept as (topic, value) and confirmed at once; ``find_dead_letter`` answers its
    look for an earlier dead letter (none, by default); ``member``: whether the group confirms the worker now."""
    sent: list[tuple[str, bytes | None]] = []

    def channel(topic: str) -> ConfirmingChannel:
        return ConfirmingChannel(topic, lambda topic, key, value, headers: sent.append((topic, value)))

    return Outbox(channel, Watermark(), "w1", find_dead_letter=find_dead_letter, member=member), sent


@dataclass
class LedgerHarness:
    """A ledger a test drives, with what the test reads of it: its task table, what its outbox sent as (topic,
    value), the runs it started and stopped (``runs``), and the next offset of each partition the test feeds."""

    ledger: Ledger
    tasks: Table
    sent: list[tuple[str, bytes | None]]
    runs: FakeRuns
    offsets: dict[TP, int] = field(default_factory=dict)

    @property
    def watermark(self) -> Watermark:
        return self.ledger.watermark

    @property
    def dispatched(self) -> list[Dispatched]:
        return self.runs.dispatched

    @property
    def stopped(self) -> list[str]:
        """The runs the ledger cancelled (``Runs.cancel``)."""
        return self.runs.cancelled


class LedgerWorld:
    """A ledger on partition 0 of every topic: its sends kept as (topic, key, value, headers), its dispatches as
    (task_id, dispatch number, traceparent)."""

    def __init__(self, settings: Settings, configs: dict[str, Any] | None = None) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None, Any]] = []
        self.dispatched: list[tuple[str, int, str | None]] = []
        self.tasks = Table()
        self.conversations = Table()
        tables = Tables(
            tasks=self.tasks, answers=Table(), jobs=Table(), timers=Table(),
            conversations=self.conversations,
        )
        outbox = Outbox(self.channel, Watermark(), "w1", find_dead_letter=_never_looked_up)

        self.payloads: dict[str, TaskPayload] = {}  # each dispatched task's payload, by task id

        def dispatched(asked: Dispatched) -> None:
            self.dispatched.append((asked.task.task_id, asked.dispatch, asked.trace))
            self.payloads[asked.task.task_id] = asked.task

        self.runs = FakeRuns(on_dispatch=dispatched)
        self.interrupted = self.runs.interrupted  # the runs asked to stop at a safe point (Runs.interrupt)
        self.ledger = Ledger(
            settings, executor=self.runs, worker_id="w1", tables=tables,
            watermark=outbox.watermark, outbox=outbox, notifier=Notifier(),
            agents=AppAgents(configs=configs or {}),
        )
        self.offsets: dict[str, int] = {}  # the next offset of each topic's partition 0

    def channel(self, topic: str) -> ConfirmingChannel:
        return ConfirmingChannel(topic, lambda *sent: self.sent.append(sent))

    async def deliver(self, topic: str, key: bytes | None, value: bytes | None, headers: Any = ()) -> None:
        """The record handled at the topic's next offset, and the loop turned until its sends are done."""
        offset = self.offsets[topic] = self.offsets.get(topic, -1) + 1
        self.ledger.handle(faust_event(TP(topic, 0), offset, key, value, headers=headers))
        for _ in range(10):
            await asyncio.sleep(0)

    def on(self, topic: str) -> list[bytes | None]:
        return [value for t, _, value, _ in self.sent if t == topic]

    def record(self, task_id: str) -> TaskRecord:
        return TaskRecord.from_json(self.tasks[task_id])


async def _never_looked_up(dlq: str, source: tuple[str, int, int], since: float) -> None:
    raise AssertionError("a first dead letter looks nothing up")


class NotHolding:
    """A ledger that holds no task here (``route.AppliesHere``): every outcome goes on the outcomes topic; the
    outcomes it was offered are kept in ``offered``."""

    def __init__(self) -> None:
        self.offered: list[tuple[str, TaskSucceeded | TaskFailed | StepDone | JournalEntry]] = []

    def apply_here(
        self, task_id: str, event: TaskSucceeded | TaskFailed | StepDone | JournalEntry,
    ) -> asyncio.Future[None] | None:
        self.offered.append((task_id, event))
        return None
