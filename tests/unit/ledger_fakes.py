"""The stand-ins the ledger's unit tests share: a table whose writes are confirmed at once, an outbox whose
sends are kept and confirmed at once, the runs the ledger starts and stops (``FakeRuns``), and the Faust event the
ledger handles."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
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


def faust_event(
    tp: TP, offset: int, key: bytes | None, value: bytes | None, *, timestamp: float | None = EVENT_TIMESTAMP,
    headers: Any = (),
) -> SimpleNamespace:
    """A Faust event of the record at ``tp``@``offset``, with what of it the ledger reads."""
    message = SimpleNamespace(tp=tp, topic=tp.topic, offset=offset, headers=list(headers), timestamp=timestamp)
    return SimpleNamespace(message=message, key=key, value=value)


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


def recording_outbox(
    find_dead_letter: Lookup = _no_dead_letter, member: Callable[[], bool] = lambda: True,
) -> tuple[Outbox, list[tuple[str, bytes | None]]]:
    """An outbox whose sends are kept as (topic, value) and confirmed at once; ``find_dead_letter`` answers its
    look for an earlier dead letter (none, by default); ``member``: whether the group confirms the worker now."""
    sent: list[tuple[str, bytes | None]] = []

    def channel(topic: str) -> SimpleNamespace:
        def send_soon(*, key: bytes | None, value: bytes | None, partition: int | None = None, headers: Any = None):
            sent.append((topic, value))
            fut = asyncio.get_running_loop().create_future()
            fut.set_result("ok")
            return fut

        return SimpleNamespace(send_soon=send_soon)

    return Outbox(channel, Watermark(), "w1", find_dead_letter=find_dead_letter, member=member), sent


class LedgerWorld:
    """A ledger on partition 0 of every topic: its sends kept as (topic, key, value, headers), its dispatches as
    (task_id, dispatch number, traceparent)."""

    def __init__(self, settings: Settings, configs: dict[str, Any] | None = None) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None, Any]] = []
        self.dispatched: list[tuple[str, int, str | None]] = []
        self.tasks = Table()
        self.conversations = Table()
        tables = Tables(
            tasks=self.tasks, answers=Table(), jobs=Table(), timers=Table(),  # type: ignore[arg-type]
            conversations=self.conversations,  # type: ignore[arg-type]
        )
        outbox = Outbox(self.channel, Watermark(), "w1", find_dead_letter=_never_looked_up)

        self.payloads: dict[str, TaskPayload] = {}  # each dispatched task's payload, by task id

        def dispatched(asked: Dispatched) -> None:
            self.dispatched.append((asked.task.task_id, asked.dispatch, asked.trace))
            self.payloads[asked.task.task_id] = asked.task

        self.runs = FakeRuns(on_dispatch=dispatched)
        self.interrupted = self.runs.interrupted  # the runs asked to stop at a safe point (Runs.interrupt)
        self.ledger = Ledger(
            settings, executor=self.runs, worker_id="w1", tables=tables,  # type: ignore[arg-type]
            watermark=outbox.watermark, outbox=outbox, notifier=Notifier(),
            agents=AppAgents(configs=configs or {}),
        )
        self.offsets: dict[str, int] = {}  # the next offset of each topic's partition 0

    def channel(self, topic: str) -> SimpleNamespace:
        def send_soon(*, key: bytes | None, value: bytes | None, partition: int | None = None, headers: Any = None):
            self.sent.append((topic, key, value, headers))
            fut = asyncio.get_running_loop().create_future()
            fut.set_result("ok")
            return fut

        return SimpleNamespace(send_soon=send_soon)

    async def deliver(self, topic: str, key: bytes, value: bytes, headers: Any = ()) -> None:
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
