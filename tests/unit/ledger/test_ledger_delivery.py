"""The outbox's deliveries (Outbox.deliver): an event's offset is held until every send it started is confirmed;
and the ledger's layer-1 dead letters through it (Ledger.handle).

Sends are futures this test answers by hand, so each path is exercised without a broker: confirmed, failed and
retried, unanswered past the timeout and re-sent, and dropped at shutdown.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from agents_stream.tables.definitions import Tables
from faust.types import TP

from agents_stream.contract import topics
from agents_stream.kafka.deadletters import DeadLetter
from agents_stream.kafka.outbox import Outbox
from agents_stream.kafka.watermark import Watermark
from agents_stream.ledger.ledger import Ledger
from agents_stream.ledger.poison import DEAD_LETTER_REQUEST, MARK_EVENT, poison_key
from agents_stream.ops.notify import Notifier
from agents_stream.settings import Settings
from tests.unit.ledger_fakes import FaustEvent, NoRuns, PlainTable, faust_event

TP0 = TP("agent.tasks.a", 0)
OUTCOMES = topics.outcomes_topic(Settings().app_id)


class Sends:
    """A send whose attempts are futures the test resolves; ``attempts`` lists them in order."""

    def __init__(self) -> None:
        self.attempts: list[asyncio.Future] = []

    def __call__(self) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.attempts.append(fut)
        return fut


class Broker:
    """The outbox's producer here: records are kept as (topic, value, future) for the test to confirm; control
    events (best effort, they hold nothing) are kept apart in ``controls`` and confirmed at once."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, asyncio.Future]] = []
        self.controls: list[bytes | None] = []

    def channel(self, topic: str) -> BrokerTopic:
        return BrokerTopic(self, topic)


@dataclass
class BrokerTopic:
    """One topic of the Broker (``kafka.outbox.Channel``)."""

    broker: Broker
    topic: str

    def send_soon(
        self, *, key: bytes | None, value: bytes | None, partition: int | None = None, headers: Any = None,
    ) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.topic == topics.CONTROL:
            self.broker.controls.append(value)
            fut.set_result("ok")
        else:
            self.broker.sent.append((self.topic, value, fut))
        return fut


async def _no_lookup(dlq: str, source: tuple[str, int, int], since: float) -> None:
    raise AssertionError("this test expects no look on the dead-letter topic")


def _outbox(broker: Broker | None = None, find: Any = _no_lookup, **kwargs: Any) -> Outbox:
    return Outbox((broker or Broker()).channel, Watermark(), "w", find_dead_letter=find, **kwargs)


def _ledger(outbox: Outbox, tasks: PlainTable | None = None) -> Ledger:
    tasks = Table() if tasks is None else tasks
    tables = Tables(tasks=tasks, answers=Table(), jobs=Table(), timers=Table())
    return Ledger(
        Settings(), executor=NoRuns(), worker_id="w", tables=tables, watermark=outbox.watermark,
        outbox=outbox, notifier=Notifier(),
    )


async def _spin(rounds: int = 5) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


async def test_the_offset_is_released_and_the_follow_up_runs_once_every_send_is_confirmed():
    outbox = _outbox()
    a, b = Sends(), Sends()
    done: list[str] = []
    outbox.watermark.handled(TP0, 7)
    outbox.deliver(TP0, 7, [a, b], [lambda: done.append("dispatch")])
    a.attempts[0].set_result("ok")
    await _spin()
    assert outbox.watermark.commit_offset(TP0) == 7 and not done, "held while one send is unanswered"
    b.attempts[0].set_result("ok")
    await _spin()
    assert done == ["dispatch"]
    assert outbox.watermark.commit_offset(TP0) == 8
    assert outbox.delivering() == 0


async def test_a_failed_send_is_sent_again_and_the_offset_held_until_it_is_confirmed():
    outbox = _outbox(retry_delay=lambda attempt: 0.0)
    a = Sends()
    done: list[str] = []
    outbox.watermark.handled(TP0, 3)
    outbox.deliver(TP0, 3, [a], [lambda: done.append("after")])
    a.attempts[0].set_exception(ConnectionError("broker down"))
    await _spin(20)
    assert len(a.attempts) == 2, "re-sent after the error"
    assert outbox.watermark.commit_offset(TP0) == 3 and not done
    a.attempts[1].set_result("ok")
    await _spin(20)
    assert done == ["after"] and outbox.watermark.commit_offset(TP0) == 4
    assert outbox.delivering() == 0


async def test_a_send_with_no_answer_is_sent_again_after_the_timeout():
    outbox = _outbox(confirm_timeout_s=0.1)
    a = Sends()
    outbox.watermark.handled(TP0, 0)
    outbox.deliver(TP0, 0, [a])
    await _spin()
    assert len(a.attempts) == 1, "not sent again before the timeout"
    async with asyncio.timeout(5):  # the retry's own wait is the same timeout: answer it as soon as it is sent
        while len(a.attempts) < 2:
            await asyncio.sleep(0)
    assert len(a.attempts) == 2, "sent again once the first attempt had no answer in time"
    assert not a.attempts[0].cancelled(), "the first attempt may still land (a duplicate, never a loss)"
    assert outbox.watermark.commit_offset(TP0) == 0
    a.attempts[1].set_result("ok")
    await _spin(20)
    assert outbox.watermark.commit_offset(TP0) == 1


async def test_deliveries_pending_at_shutdown_keep_their_offsets_held():
    outbox = _outbox()
    a = Sends()
    done: list[str] = []
    outbox.watermark.handled(TP0, 5)
    outbox.deliver(TP0, 5, [a], [lambda: done.append("after")])
    await outbox.stop()
    a.attempts[0].set_result("ok")  # confirmed after the stop: too late to count
    await _spin()
    assert not done
    assert outbox.watermark.commit_offset(TP0) == 5


class Table(PlainTable):
    """The task table as the ledger uses it: a dict whose writes leave a changelog future (confirmed at once)."""

    last_changelog: asyncio.Future | None = None

    def __setitem__(self, key, value):  # type: ignore[no-untyped-def]
        super().__setitem__(key, value)
        self.last_changelog = asyncio.get_running_loop().create_future()
        self.last_changelog.set_result("ok")


def _poison_ledger(
    find: Any = _no_lookup, tasks: PlainTable | None = None, **kwargs: Any,
) -> tuple[Ledger, list[tuple[str, bytes | None, asyncio.Future]]]:
    """A ledger whose sends are recorded as (topic, value, future); the test confirms them."""
    broker = Broker()
    ledger = _ledger(_outbox(broker, find, **kwargs), tasks)
    return ledger, broker.sent


def _kinds(ledger: Ledger, sent: list[tuple[str, bytes | None, asyncio.Future]]) -> list[str]:
    """What was sent, as 'dlq' or the outcome event's kind."""
    return ["dlq" if topic.endswith(".dlq") else json.loads(value)["kind"] for topic, value, _ in sent]


async def _confirm_all(sent: list[tuple[str, bytes | None, asyncio.Future]]) -> None:
    """The broker confirms every send, also those the confirmations lead to (the dead_lettered event)."""
    for _ in range(3):
        for _, _, fut in sent:
            if not fut.done():
                fut.set_result("ok")
        await _spin(10)


TP1 = TP("agent.tasks.a", 1)
PILL = b"\xff not utf-8"


async def test_a_poison_message_is_dead_lettered_once_its_request_comes_back_and_then_marked():
    ledger, sent = _poison_ledger()
    ledger.handle(_event(TP1, 63, PILL))
    assert _kinds(ledger, sent) == ["dead_letter"], "asked through the outcomes topic first"
    ledger.handle(_event(TP(OUTCOMES, 1), 0, sent[0][1], key=poison_key(TP1.topic, 63).encode()))
    assert _kinds(ledger, sent) == ["dead_letter", "dlq"]
    assert ledger.watermark.commit_offset(TP1) == 63, "held until the dead letter is confirmed"
    sent[0][2].set_result("ok")
    sent[1][2].set_result("ok")
    await _spin(10)
    assert _kinds(ledger, sent) == ["dead_letter", "dlq", "dead_lettered"]
    assert ledger.watermark.commit_offset(TP1) == 63, "and its dead_lettered event (the marker comes from it)"
    await _confirm_all(sent)
    assert ledger.watermark.commit_offset(TP1) == 64
    ledger.handle(_event(TP(OUTCOMES, 1), 1, sent[2][1], key=poison_key(TP1.topic, 63).encode()))
    ledger.handle(_event(TP1, 63, PILL))  # redelivered after a crash: the marker answers
    assert _kinds(ledger, sent) == ["dead_letter", "dlq", "dead_lettered"]


async def test_a_poison_message_redelivered_while_its_dead_letter_is_on_its_way_is_not_dead_lettered_again():
    """The chaos run's double dead letters: a broker restart's rebalance gave a partition back to the same worker
    while its dead letter was still unconfirmed, and the redelivery, finding no marker yet, sent a second one."""
    ledger, sent = _poison_ledger()
    marker = poison_key(TP1.topic, 63).encode()
    ledger.handle(_event(TP1, 63, PILL))
    ledger.handle(_event(TP(OUTCOMES, 1), 0, DEAD_LETTER_REQUEST, key=marker))
    ledger.forget({TP1})  # revoked and assigned again: redelivered from the commit
    ledger.watermark.start(TP1, 63)
    ledger.handle(_event(TP1, 63, PILL))
    assert _kinds(ledger, sent) == ["dead_letter", "dlq"], "no second request, no second dead letter"
    assert ledger.watermark.commit_offset(TP1) == 63, "held until the first dead letter is confirmed"
    await _confirm_all(sent)
    assert _kinds(ledger, sent) == ["dead_letter", "dlq", "dead_lettered"]
    assert ledger.watermark.commit_offset(TP1) == 64


async def test_a_worker_that_died_before_its_marker_was_written_leaves_no_second_dead_letter():
    """Worker A dead-lettered the message and sent its dead_lettered event, then died before the commit. The new
    owner gets the message again, asks; A's event is ahead of the request on the same partition, so the new owner
    writes the marker first and its request finds it."""
    ledger, sent = _poison_ledger()
    marker = poison_key(TP1.topic, 63).encode()
    ledger.watermark.start(TP1, 63)
    ledger.handle(_event(TP1, 63, PILL))
    ledger.handle(_event(TP(OUTCOMES, 1), 10, MARK_EVENT, key=marker))  # A's, before ours
    ledger.handle(_event(TP(OUTCOMES, 1), 11, DEAD_LETTER_REQUEST, key=marker))  # ours
    await _confirm_all(sent)
    assert _kinds(ledger, sent) == ["dead_letter"], "no dead letter: A's is there"
    assert ledger.watermark.commit_offset(TP1) == 64


async def test_a_delivery_confirmed_after_a_revoke_does_not_release_the_hold_of_the_redelivery():
    outbox = _outbox()
    ledger = _ledger(outbox)
    old, new = Sends(), Sends()
    ledger.watermark.handled(TP0, 9)
    outbox.deliver(TP0, 9, [old])
    ledger.forget({TP0})  # revoked, assigned again, redelivered from the commit
    ledger.watermark.start(TP0, 9)
    outbox.deliver(TP0, 9, [new])
    ledger.watermark.handled(TP0, 9)
    old.attempts[0].set_result("ok")
    await _spin()
    assert ledger.watermark.commit_offset(TP0) == 9, "the old delivery released nothing of the new assignment"
    new.attempts[0].set_result("ok")
    await _spin()
    assert ledger.watermark.commit_offset(TP0) == 10


def _event(tp: TP, offset: int, value: bytes, key: bytes = b"k") -> FaustEvent:
    return faust_event(tp, offset, key, value)


async def test_a_record_past_a_gap_is_not_applied_before_the_records_it_skipped():
    """The chaos run's last double dead letter: after a rebalance the consumer went on past a dead owner's
    dead_lettered event; the ledger applied this worker's later request first, found no marker and sent a second
    dead letter. Records past a gap now wait until the partition is read again from the gap, in order."""
    ledger, sent = _poison_ledger()
    gaps: list[tuple[TP, int]] = []
    ledger.on_gap = lambda tp, offset: gaps.append((tp, offset)) or True  # type: ignore[method-assign]
    ledger.watermark.start(TP1, 5)
    ledger.handle(_event(TP1, 7, PILL))
    assert gaps == [(TP1, 5)] and sent == [], "not applied: 5 and 6 never arrived"
    assert ledger.watermark.commit_offset(TP1) == 5
    for offset in (5, 6, 7):  # read again from 5
        ledger.handle(_event(TP1, offset, PILL))
    assert [json.loads(value)["kind"] for _, value, _ in sent] == ["dead_letter"] * 3
    assert sorted(ledger.poison.dead_lettering()) == [(TP1, 5), (TP1, 6), (TP1, 7)]
    assert gaps == [(TP1, 5)]


class SlowTable(Table):
    """A task table whose changelog sends the test confirms by hand (``changelog`` lists them)."""

    def __init__(self) -> None:
        super().__init__()
        self.changelog: list[asyncio.Future] = []

    def __setitem__(self, key, value):  # type: ignore[no-untyped-def]
        dict.__setitem__(self, key, value)
        self.last_changelog = asyncio.get_running_loop().create_future()
        self.changelog.append(self.last_changelog)


async def test_the_marker_says_sending_in_the_changelog_before_the_dead_letter_goes():
    """So a worker that dies after its dead letter leaves the next owner a sign to look for it on the topic."""
    tasks = SlowTable()
    ledger, sent = _poison_ledger(tasks=tasks)
    marker = poison_key(TP1.topic, 63)
    ledger.handle(_event(TP1, 63, PILL))
    ledger.handle(_event(TP(OUTCOMES, 1), 0, DEAD_LETTER_REQUEST, key=marker.encode()))
    assert json.loads(ledger.table[marker])["by"] == "w"
    assert _kinds(ledger, sent) == ["dead_letter"], "no dead letter before the changelog has the marker"
    tasks.changelog[0].set_result("ok")
    await _spin(10)
    assert _kinds(ledger, sent) == ["dead_letter", "dlq"]
    await _confirm_all(sent)
    assert _kinds(ledger, sent) == ["dead_letter", "dlq", "dead_lettered"]
    assert ledger.watermark.commit_offset(TP1) == 64


def _lookups(found: object, fail: int = 0) -> tuple[Any, list[tuple]]:
    """The outbox's look on the dead-letter topic: it answers ``found`` after failing ``fail`` times.
    Returns (the finder, the lookups made, as (dlq, source, since))."""
    lookups: list[tuple] = []

    async def find(dlq, source, since):  # type: ignore[no-untyped-def]
        lookups.append((dlq, source, since))
        if len(lookups) <= fail:
            raise ConnectionError("broker down")
        return found

    return find, lookups


def _begun_by_a_dead_owner(found: object, fail: int = 0, **kwargs: Any) -> tuple[Ledger, list, list]:
    """A ledger whose table says another worker began the dead letter of TP1@63 and never marked it; its DLQ
    lookup answers ``found`` after failing ``fail`` times. Returns (ledger, sent, lookups)."""
    find, lookups = _lookups(found, fail)
    ledger, sent = _poison_ledger(find, **kwargs)
    ledger.table[poison_key(TP1.topic, 63)] = json.dumps({"sending": 1000.0, "by": "dead"})
    return ledger, sent, lookups


async def _redeliver_and_ask(ledger: Ledger, sent: list) -> None:
    marker = poison_key(TP1.topic, 63).encode()
    ledger.watermark.start(TP1, 63)
    ledger.handle(_event(TP1, 63, PILL))
    assert _kinds(ledger, sent) == ["dead_letter"], "a begun dead letter is not a done one: ask"
    ledger.handle(_event(TP(OUTCOMES, 1), 11, DEAD_LETTER_REQUEST, key=marker))


async def test_a_dead_letter_an_owner_sent_before_dying_unmarked_is_marked_not_sent_again():
    """The moderate chaos run's last double dead letter: a worker was SIGKILLed after its dead letter reached the
    topic and before its dead_lettered event did. The next owner finds it there."""
    ledger, sent, lookups = _begun_by_a_dead_owner(found=DeadLetter("agent.tasks.a.dlq", 3, 0, None, None, {}))
    await _redeliver_and_ask(ledger, sent)
    await _confirm_all(sent)
    assert lookups == [("agent.tasks.a.dlq", (TP1.topic, 1, 63), 1000.0)]
    assert _kinds(ledger, sent) == ["dead_letter", "dead_lettered"], "marked, no second dead letter"
    assert ledger.watermark.commit_offset(TP1) == 64


async def test_a_dead_letter_an_owner_began_but_never_sent_is_sent_once():
    # the lookup is retried as a send: no backoff between its attempts
    ledger, sent, lookups = _begun_by_a_dead_owner(found=None, fail=2, retry_delay=lambda attempt: 0.0)
    await _redeliver_and_ask(ledger, sent)
    await _spin(20)
    assert len(lookups) == 3, "a failed lookup is retried, the message held meanwhile"
    await _confirm_all(sent)
    assert _kinds(ledger, sent) == ["dead_letter", "dlq", "dead_lettered"]
    assert ledger.watermark.commit_offset(TP1) == 64


async def _dead_letter_whose_send_fails(found: object) -> tuple[Ledger, list, list]:
    """A poison message whose dead-letter send fails (the broker may have appended it all the same)."""
    find, lookups = _lookups(found)
    ledger, sent = _poison_ledger(find, retry_delay=lambda attempt: 0.0)
    ledger.handle(_event(TP1, 63, PILL))
    ledger.handle(_event(TP(OUTCOMES, 1), 0, DEAD_LETTER_REQUEST, key=poison_key(TP1.topic, 63).encode()))
    assert _kinds(ledger, sent) == ["dead_letter", "dlq"]
    sent[1][2].set_exception(ConnectionError("connection lost before the answer"))
    await _confirm_all(sent)
    return ledger, sent, lookups


async def test_a_dead_letter_whose_failed_send_landed_all_the_same_is_not_sent_again():
    landed = DeadLetter("agent.tasks.a.dlq", 2, 5, None, None, {})
    ledger, sent, lookups = await _dead_letter_whose_send_fails(found=landed)
    assert [lookup[:2] for lookup in lookups] == [("agent.tasks.a.dlq", (TP1.topic, 1, 63))], (
        "looked on the topic before re-sending")
    assert _kinds(ledger, sent) == ["dead_letter", "dlq", "dead_lettered"], "not sent a second time"
    assert ledger.watermark.commit_offset(TP1) == 64


async def test_a_dead_letter_whose_failed_send_did_not_land_is_sent_again():
    ledger, sent, lookups = await _dead_letter_whose_send_fails(found=None)
    assert len(lookups) == 1
    assert _kinds(ledger, sent) == ["dead_letter", "dlq", "dlq", "dead_lettered"]
    assert ledger.watermark.commit_offset(TP1) == 64


async def test_a_dead_letter_unanswered_past_the_timeout_is_waited_for_not_sent_again():
    find, lookups = _lookups(found=None)
    ledger, sent = _poison_ledger(find, confirm_timeout_s=0.05)
    ledger.handle(_event(TP1, 63, PILL))
    ledger.handle(_event(TP(OUTCOMES, 1), 0, DEAD_LETTER_REQUEST, key=poison_key(TP1.topic, 63).encode()))
    sent[0][2].set_result("ok")
    await asyncio.sleep(0.08)  # the timeout passed: the retry waits for the first attempt's answer
    sent[1][2].set_result("ok")  # which comes late, and says it landed
    await _confirm_all(sent)
    assert _kinds(ledger, sent) == ["dead_letter", "dlq", "dead_lettered"] and lookups == []
    assert ledger.watermark.commit_offset(TP1) == 64
