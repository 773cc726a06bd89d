"""Where an outcome of this worker's executor goes: applied here by the ledger that holds its task
(``Ledger.apply_here``), or on the outcomes topic to whoever owns the task's partition now."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Protocol

from agents_stream.contract.errors import Fenced
from agents_stream.contract.events import (
    CallParked,
    CallsDelegated,
    Heartbeat,
    JournalEntry,
    OutcomeEvent,
    StepDone,
    TaskFailed,
    TaskSucceeded,
    encode,
)
from agents_stream.kafka.delivery import until_confirmed
from agents_stream.ops import metrics

__all__ = ["JOURNAL_DURABLE_S", "AppliesHere", "OutcomeRoute"]

log = logging.getLogger(__name__)

#: how long an agent loop waits for a journal entry applied here to be durable before its run gives up (the lease
#: then lapses and the task resumes from its journal; the outbox keeps retrying the send meanwhile)
JOURNAL_DURABLE_S = 120.0


class AppliesHere(Protocol):
    """What the route needs of the ledger (``Ledger`` is one): an outcome of this worker's executor applied at once,
    with the future of its durability, or None when the ledger does not hold the task (``Ledger.apply_here``)."""

    def apply_here(
        self, task_id: str, event: TaskSucceeded | TaskFailed | StepDone | JournalEntry,
    ) -> asyncio.Future[None] | None: ...


class OutcomeRoute:
    """Sends each outcome of the executor where it is applied (docs/decisions.md, "Outcomes applied where they ran").

    ``produce(key, value)`` starts one send on the outcomes topic; ``member()`` says whether this worker is a
    confirmed member of its group now (Runtime.member); ``owns(task_id)`` whether the task's partition is this
    worker's too (a task resumed after a decision or its sub-tasks holds no offset here, so its journal entries go
    on the topic to this very worker's ledger); ``stopping()`` whether the worker is shutting down.
    """

    def __init__(
        self, ledger: AppliesHere, produce: Callable[[bytes, bytes], Any], *, member: Callable[[], bool],
        send_control: Callable[[str, str, str | None, dict[str, Any]], None], stopping: Callable[[], bool],
        owns: Callable[[str], bool] = lambda task_id: True,
    ) -> None:
        self.ledger = ledger
        self.produce = produce
        self.member = member
        #: this worker owns the task's partition now, and the group confirms it a member (Runtime.owns)
        self.owns = owns
        self.send_control = send_control
        self.stopping = stopping
        self.finishing: set[str] = set()  # tasks whose final outcome this worker sent on the topic while stopping
        self.via_topic: set[tuple[str, int]] = set()  # runs (task_id, dispatch) whose outcomes go on the topic

    async def send(self, task_id: str, outcome: OutcomeEvent) -> None:
        """Executor → ledger: applied here when this worker's ledger holds the task (``Ledger.apply_here``),
        else sent on the outcomes topic, retried until the broker confirms it (heartbeats are not retried).

        A run's outcomes keep their order: once one of them went on the topic (its partition moved), the rest
        follow it there. A journal entry (JournalEntry) or a step checkpoint (StepDone) returns once it is durable
        here, while the partition is this worker's, or once it is on the topic of a partition this worker owns; it
        raises Fenced when neither can be known (the entry went to another worker's partition, or the partition
        moved before it was durable): the run must not act on it. A final outcome returns at once."""
        if isinstance(outcome, TaskSucceeded | TaskFailed | StepDone | JournalEntry):
            run = (task_id, outcome.dispatch)
            durable = None
            started = time.monotonic()
            if run not in self.via_topic and self.member():
                try:
                    durable = self.ledger.apply_here(task_id, outcome)
                except Exception as exc:  # a bug in the ledger must not lose the outcome: the topic carries it
                    log.exception(
                        "Applying the outcome of %s here failed (%r); it goes on the outcomes topic instead. The "
                        "task's offset stays held until it is applied; report this with the log", task_id, exc,
                    )
                    self.send_control("alert.ledger_error", task_id, None, {"error": repr(exc)[:500]})
            if durable is not None:
                if isinstance(outcome, StepDone | JournalEntry):  # the run acts on it only once it is durable
                    try:
                        await asyncio.wait_for(asyncio.shield(durable), timeout=JOURNAL_DURABLE_S)
                    except TimeoutError:
                        raise TimeoutError(
                            f"the {_named(outcome)} of {task_id} was not durable within "
                            f"{JOURNAL_DURABLE_S:.0f}s (is the broker reachable?); the run stops here and resumes from "
                            "its journal once its lease lapses"
                        ) from None
                    metrics.journal_durable.observe(time.monotonic() - started)
                return
            if isinstance(outcome, StepDone | JournalEntry):
                self.via_topic.add(run)
            else:
                self.via_topic.discard(run)
        elif isinstance(outcome, CallParked | CallsDelegated):
            self.via_topic.discard((task_id, outcome.dispatch))  # the run ends here
        body = encode(outcome)  # the executor named this worker in it

        def send() -> Any:
            return self.produce(task_id.encode(), body)

        if isinstance(outcome, Heartbeat):
            # The lease has slack for a lost one; the next round sends again. Sent also while the group has not
            # confirmed this worker lately (a rebalance): a beat of a worker that left the group keeps nothing from
            # the partition's owner, which takes over a departed owner's tasks whatever their lease says.
            send()
            return
        await until_confirmed(
            send,
            what=f"the outcome of {task_id}",
            alert=lambda exc: self.send_control("alert.broker_send_failing", task_id, None, {"error": repr(exc)}),
        )
        if isinstance(outcome, StepDone | JournalEntry) and not self.owns(task_id):
            self.via_topic.discard((task_id, outcome.dispatch))  # the run ends here: only its release follows
            # On the topic, the entry is applied by the partition's owner, if its run still holds the lease; this
            # run cannot know whether it was, so it must not act on it: it stops, and the owner carries the task
            # on from its journal (docs/security.md, "Fencing").
            raise Fenced(
                f"task {task_id}: {_named(outcome)} of dispatch {outcome.dispatch} went to the partition's "
                "owner on the outcomes topic (this worker no longer holds the task); the run stops without acting on it"
            )
        if self.stopping() and isinstance(outcome, (TaskSucceeded, TaskFailed)):
            self.finishing.add(task_id)


def _named(entry: StepDone | JournalEntry) -> str:
    """How a message names the entry: an agent loop's journal entry, or a step (or saga report) checkpoint."""
    return f"journal entry {entry.index}" if isinstance(entry, JournalEntry) else f"step checkpoint {entry.index}"
