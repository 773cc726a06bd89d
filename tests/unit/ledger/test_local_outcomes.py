"""Outcomes the ledger applies where they ran (Ledger.apply_here).

An outcome of this worker's executor is applied without the outcomes topic only while the ledger holds the task's
offset, and what it waits for is the durability of the writes it caused.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from agents_stream.tables import leases
from agents_stream.tables.definitions import Tables
from faust.types import TP

from agents_stream.contract import topics
from agents_stream.contract.events import JournalEntry, StepDone, encode
from agents_stream.contract.models import TaskPayload
from agents_stream.execution import run as outcome
from agents_stream.execution.run import Answer, Run
from agents_stream.ledger.ledger import Ledger
from agents_stream.ops.notify import Notifier
from agents_stream.settings import Settings
from tests.unit.ledger_fakes import FakeRuns, LedgerHarness, Table, faust_event, recording_outbox

AGENT = "a"
TOPIC = topics.task_topic(AGENT)
TASK = TaskPayload(task_id="t1", agent_name=AGENT, instruction="Sum it up.")
HOME = TP(TOPIC, topics.partition_for(b"t1", 4))  # the task's own partition: no re-route


async def _spin() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


# -- outcomes applied where they ran ----------------------------------------------------------------------------

class PendingTable(Table):
    """A table whose writes are confirmed only when the test says so."""

    def _confirmed(self) -> None:
        self.last_changelog = asyncio.get_running_loop().create_future()
        self.unconfirmed.append(self.last_changelog)

    def confirm_all(self) -> None:
        for fut in self.unconfirmed:
            if not fut.done():
                fut.set_result("ok")
        self.unconfirmed.clear()


def _ledger(tasks: Table | None = None, member: Any = lambda: True) -> LedgerHarness:
    outbox, sent = recording_outbox(member=member)
    tasks = tasks if tasks is not None else Table()
    runs = FakeRuns()
    ledger = Ledger(Settings(partitions=4), executor=runs, worker_id="w1",
                    tables=Tables(tasks=tasks, answers=Table(), jobs=Table(), timers=Table()),
                    watermark=outbox.watermark, outbox=outbox, notifier=Notifier())
    return LedgerHarness(ledger, tasks, sent, runs)


def _received(f: LedgerHarness, tp: TP = HOME, offset: int = 7) -> None:
    """The task arrived on ``tp``@``offset`` and was leased and dispatched here."""
    f.watermark.start(tp, offset)
    f.ledger.handle(faust_event(tp, offset, b"t1", TASK.model_dump_json().encode()))


def _run() -> Run:
    return Run(TASK, 1, "w1")


async def _finished_here(output: str) -> LedgerHarness:
    """A ledger that received the task, ran it here and applied its answer ``output`` where it ran."""
    f = _ledger()
    _received(f)
    await _spin()
    f.ledger.apply_here("t1", outcome.succeeded(_run(), Answer(output, "high", "primary:p")))
    await _spin()
    return f


async def _applied_with_its_record_unconfirmed(member: Any = lambda: True) -> tuple[LedgerHarness, PendingTable, Any]:
    """A ledger that received the task (offset 0, its lease record confirmed) and applied its answer where it ran,
    the finished record's changelog send not yet confirmed: the ledger, its task table, apply_here's future."""
    tasks = PendingTable()
    tasks.unconfirmed = []
    f = _ledger(tasks, member=member)
    _received(f, HOME, 0)
    tasks.confirm_all()
    await _spin()
    durable = f.ledger.apply_here("t1", outcome.succeeded(_run(), Answer("done", "high", "primary:p")))
    await _spin()
    return f, tasks, durable


def _results(f: LedgerHarness) -> list[str]:
    """The sends to agent.results so far."""
    return [t for t, _ in f.sent if t == topics.RESULTS]


async def test_a_final_outcome_of_a_task_held_here_is_applied_without_the_outcomes_topic() -> None:
    """The result is stored and sent, the task's offset is released (the commit passes it), and nothing goes on
    the outcomes topic."""
    f = _ledger()
    tp = HOME
    _received(f, tp)
    await _spin()
    assert f.dispatched and f.tasks["t1"]["state"] == leases.RUNNING
    assert f.watermark.commit_offset(tp) == 7, "the running task holds its offset"
    durable = f.ledger.apply_here("t1", outcome.succeeded(_run(), Answer({"n": 1}, "high", "primary:p")))
    assert durable is not None
    await _spin()
    assert durable.done()
    assert f.tasks["t1"]["state"] == leases.SUCCEEDED
    [result] = [json.loads(v or b"") for t, v in f.sent if t == topics.RESULTS]
    assert (result["task_id"], result["status"], result["output"]) == ("t1", "succeeded", {"n": 1})
    assert f.watermark.commit_offset(tp) == 8, "the finished task no longer holds the commit"
    assert not [t for t, _ in f.sent if t == topics.outcomes_topic(Settings().app_id)]


async def test_an_outcome_of_a_task_this_ledger_does_not_hold_goes_on_the_topic() -> None:
    """Not received here, or its partition revoked since: apply_here declines, so the owner applies it."""
    f = _ledger()
    assert f.ledger.apply_here("t1", outcome.succeeded(_run(), Answer("x", "high", "primary:p"))) is None
    tp = HOME
    _received(f, tp)
    await _spin()
    f.ledger.forget({tp})
    assert f.ledger.apply_here("t1", outcome.succeeded(_run(), Answer("x", "high", "primary:p"))) is None
    assert f.tasks["t1"]["state"] == leases.RUNNING


# A journal entry, and a step checkpoint (what a previous version sent for a journal entry too): applied alike.
@pytest.mark.parametrize("kept", [JournalEntry, StepDone])
async def test_a_journal_entry_applied_here_is_awaited_until_its_write_is_confirmed(
    kept: type[JournalEntry] | type[StepDone],
) -> None:
    """The loop acts on a journal entry only once it is durable: the future waits for the table's changelog."""
    tasks = PendingTable()
    tasks.unconfirmed = []
    f = _ledger(tasks)
    tp = HOME
    _received(f, tp, 0)
    tasks.confirm_all()
    await _spin()
    assert f.dispatched
    durable = f.ledger.apply_here("t1", kept(worker="w1", dispatch=1, index=0, output={"turn": 1}))
    assert durable is not None
    await _spin()
    assert not durable.done(), "settled before its write was confirmed"
    assert json.loads(tasks["t1"]["steps_done"]) == [{"turn": 1}]
    tasks.confirm_all()
    await _spin()
    assert durable.done()
    assert f.watermark.commit_offset(tp) == 0, "a journal entry does not end the task: its offset stays held"


async def test_a_second_final_outcome_after_the_task_finished_here_goes_on_the_topic() -> None:
    """The task's offsets were released with its first outcome: a second one (a re-dispatch racing) is not
    applied here; the owner applies it from the topic, where it changes nothing."""
    f = await _finished_here("first")
    before = list(f.sent)
    assert f.ledger.apply_here("t1", outcome.succeeded(Run(TASK, 2, "w1"), Answer("late", "high", "p"))) is None
    assert json.loads(f.tasks["t1"]["result"])["output"] == "first" and f.sent == before


async def test_a_record_handled_again_since_the_assignment_changes_nothing() -> None:
    """A re-read of a gap can deliver a record the fetch before it delivered too: the ledger, already past that
    offset, does not apply it again (a finished task's result would be sent a second time)."""
    f = await _finished_here("once")
    sent = len(f.sent)
    f.ledger.handle(faust_event(HOME, 7, b"t1", TASK.model_dump_json().encode()))
    await _spin()
    assert len(f.sent) == sent, "the record at offset 7 was applied twice"
    f.ledger.handle(faust_event(HOME, 8, b"t1", TASK.model_dump_json().encode()))  # a real redelivery, later
    await _spin()
    assert [t for t, _ in f.sent[sent:]] == [topics.RESULTS], "a new record of a finished task re-emits its result"


async def test_a_result_applied_here_is_sent_only_once_its_finished_record_is_durable() -> None:
    """No outcome record stands behind it: were the result sent first and the worker killed before the record
    landed, the next owner would run the task again and send a second, different result."""
    f, tasks, durable = await _applied_with_its_record_unconfirmed()
    assert tasks["t1"]["state"] == leases.SUCCEEDED
    assert not _results(f), "the result went out before its record was durable"
    assert f.watermark.commit_offset(HOME) == 0 and durable is not None and not durable.done()
    tasks.confirm_all()
    await _spin()
    assert _results(f) == [topics.RESULTS]
    assert durable.done() and f.watermark.commit_offset(HOME) == 1, "released once the result is confirmed too"


async def test_a_result_whose_partition_moved_before_its_record_was_durable_is_left_to_the_next_owner() -> None:
    """Revoked meanwhile: the next owner, assigned after the record was durable, finds the task finished and sends
    the stored result; this worker sending it too could be a second, different result (the next owner may have
    recovered before the record landed and run the task again)."""
    f, tasks, _ = await _applied_with_its_record_unconfirmed()
    f.ledger.forget({HOME})
    tasks.confirm_all()
    await _spin()
    assert not _results(f)


OUTCOMES_HOME = TP(topics.outcomes_topic(Settings().app_id), HOME.partition)  # co-partitioned with the task


async def _outcome_read_with_its_record_unconfirmed() -> tuple[LedgerHarness, PendingTable, bytes]:
    """A ledger that received the task (its lease record confirmed), then read its answer on the outcomes topic (a
    run on a worker the partition had moved from): the finished record's changelog send not yet confirmed. The
    ledger, its task table, the outcome record's value."""
    tasks = PendingTable()
    tasks.unconfirmed = []
    f = _ledger(tasks)
    _received(f, HOME, 0)
    tasks.confirm_all()
    await _spin()
    value = encode(outcome.succeeded(_run(), Answer("done", "high", "primary:p")))
    f.watermark.start(OUTCOMES_HOME, 3)
    f.ledger.handle(faust_event(OUTCOMES_HOME, 3, b"t1", value))
    await _spin()
    return f, tasks, value


async def test_a_result_read_on_the_outcomes_topic_is_sent_only_once_its_finished_record_is_durable() -> None:
    """Sent beside its record, a result could land while the record, written by a worker that lost the partition
    meanwhile, is skipped by the next owner (an older owner epoch): the task would run again and answer twice."""
    f, tasks, _ = await _outcome_read_with_its_record_unconfirmed()
    assert tasks["t1"]["state"] == leases.SUCCEEDED
    assert not _results(f), "the result went out before its record was durable"
    assert f.watermark.commit_offset(OUTCOMES_HOME) == 3, "the outcome's offset is held"
    tasks.confirm_all()
    await _spin()
    assert _results(f) == [topics.RESULTS]
    assert f.watermark.commit_offset(OUTCOMES_HOME) == 4


async def test_an_outcome_read_again_after_its_result_was_fenced_sends_the_stored_result() -> None:
    """The partition moved before the finished record was confirmed: no result from here, and the outcome's offset
    is not released. The next owner reads the outcome again, finds the task finished by that very dispatch, and
    sends the stored result: nothing is lost, and nothing runs again."""
    f, tasks, value = await _outcome_read_with_its_record_unconfirmed()
    f.ledger.forget({HOME, OUTCOMES_HOME})
    tasks.confirm_all()
    await _spin()
    assert not _results(f), "fenced: its partition moved before the record was durable"
    stored = tasks["t1"]["result"]
    f.watermark.start(OUTCOMES_HOME, 3)  # the next owner (the same table, recovered) reads from the group's commit
    f.ledger.handle(faust_event(OUTCOMES_HOME, 3, b"t1", value))
    await _spin()
    assert _results(f) == [topics.RESULTS]
    assert [v for t, v in f.sent if t == topics.RESULTS] == [stored.encode()], "the stored result, byte for byte"
    assert not f.dispatched[1:], "the task did not run again"


async def test_a_result_applied_here_waits_while_the_group_has_not_confirmed_this_worker() -> None:
    """No commit accepted lately: the result waits (its offset held) until one is, then goes out."""
    confirmed = [True]
    f, tasks, _ = await _applied_with_its_record_unconfirmed(member=lambda: confirmed[0])
    confirmed[0] = False
    tasks.confirm_all()
    await asyncio.sleep(0.7)
    assert not _results(f) and f.watermark.commit_offset(HOME) == 0
    confirmed[0] = True
    await asyncio.sleep(0.7)
    assert _results(f) == [topics.RESULTS]
    assert f.watermark.commit_offset(HOME) == 1
