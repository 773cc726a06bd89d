"""The ledger's deliveries (Ledger._deliver): an event's offset is held until every send it started is confirmed.

Sends are futures this test answers by hand, so each path is exercised without a broker: confirmed, failed and
retried, unanswered past the timeout and re-sent, and dropped at shutdown.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from faust.types import TP

from agents_stream.kafka.watermark import Watermark
from agents_stream.ledger import ledger as ledger_module
from agents_stream.ledger.ledger import Ledger
from agents_stream.settings import Settings

TP0 = TP("agent.tasks.a", 0)


class Sends:
    """A send whose attempts are futures the test resolves; ``attempts`` lists them in order."""

    def __init__(self) -> None:
        self.attempts: list[asyncio.Future] = []

    def __call__(self) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.attempts.append(fut)
        return fut


def _ledger() -> Ledger:
    app = SimpleNamespace(watermark=Watermark(), task_table={}, answers_table={}, timers_table={})
    ledger = Ledger(app, Settings(), executor=None, worker_id="w")  # type: ignore[arg-type]
    ledger.control = lambda *args, **kwargs: None  # type: ignore[method-assign]  # alerts need a producer
    return ledger


async def _spin(rounds: int = 5) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


async def test_the_offset_is_released_and_the_follow_up_runs_once_every_send_is_confirmed():
    ledger = _ledger()
    a, b = Sends(), Sends()
    done: list[str] = []
    ledger.watermark.handled(TP0, 7)
    ledger._deliver(TP0, 7, [a, b], [lambda: done.append("dispatch")])
    a.attempts[0].set_result("ok")
    await _spin()
    assert ledger.watermark.commit_offset(TP0) == 7 and not done, "held while one send is unanswered"
    b.attempts[0].set_result("ok")
    await _spin()
    assert done == ["dispatch"]
    assert ledger.watermark.commit_offset(TP0) == 8
    assert ledger.delivering() == 0


async def test_a_failed_send_is_sent_again_and_the_offset_held_until_it_is_confirmed(monkeypatch):
    monkeypatch.setattr("agents_stream.kafka.delivery.backoff", lambda attempt, base, cap: 0.0)
    ledger = _ledger()
    a = Sends()
    done: list[str] = []
    ledger.watermark.handled(TP0, 3)
    ledger._deliver(TP0, 3, [a], [lambda: done.append("after")])
    a.attempts[0].set_exception(ConnectionError("broker down"))
    await _spin(20)
    assert len(a.attempts) == 2, "re-sent after the error"
    assert ledger.watermark.commit_offset(TP0) == 3 and not done
    a.attempts[1].set_result("ok")
    await _spin(20)
    assert done == ["after"] and ledger.watermark.commit_offset(TP0) == 4
    assert ledger.delivering() == 0


async def test_a_send_with_no_answer_is_sent_again_after_the_timeout(monkeypatch):
    monkeypatch.setattr(ledger_module, "CONFIRM_TIMEOUT_S", 0.05)
    ledger = _ledger()
    a = Sends()
    ledger.watermark.handled(TP0, 0)
    ledger._deliver(TP0, 0, [a])
    await asyncio.sleep(0.2)
    assert len(a.attempts) == 2, "sent again once the first attempt had no answer in time"
    assert not a.attempts[0].cancelled(), "the first attempt may still land (a duplicate, never a loss)"
    assert ledger.watermark.commit_offset(TP0) == 0
    a.attempts[1].set_result("ok")
    await _spin(20)
    assert ledger.watermark.commit_offset(TP0) == 1


async def test_deliveries_pending_at_shutdown_keep_their_offsets_held():
    ledger = _ledger()
    a = Sends()
    done: list[str] = []
    ledger.watermark.handled(TP0, 5)
    ledger._deliver(TP0, 5, [a], [lambda: done.append("after")])
    await ledger.stop()
    a.attempts[0].set_result("ok")  # confirmed after the stop: too late to count
    await _spin()
    assert not done
    assert ledger.watermark.commit_offset(TP0) == 5


class Table(dict):
    """The task table as the ledger uses it: a dict whose writes leave a changelog future (confirmed at once)."""

    last_changelog: asyncio.Future | None = None

    def __setitem__(self, key, value):  # type: ignore[no-untyped-def]
        super().__setitem__(key, value)
        self.last_changelog = asyncio.get_running_loop().create_future()
        self.last_changelog.set_result("ok")


def _poison_ledger() -> tuple[Ledger, list[tuple[str, bytes | None, asyncio.Future]]]:
    """A ledger whose sends are recorded as (topic, value, future); the test confirms them."""
    ledger = _ledger()
    ledger.table = Table()
    sent: list[tuple[str, bytes | None, asyncio.Future]] = []

    def send(topic, key, value, *, partition=None, headers=None):  # type: ignore[no-untyped-def]
        fut = asyncio.get_running_loop().create_future()
        sent.append((topic, value, fut))
        return fut

    ledger._send = send  # type: ignore[method-assign]
    return ledger, sent


def _kinds(ledger: Ledger, sent: list[tuple[str, bytes | None, asyncio.Future]]) -> list[str]:
    """What was sent, as 'dlq' or the outcome event's kind."""
    import json

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
    ledger._on_task(TP1, 63, b"k", PILL, [])
    ledger.watermark.handled(TP1, 63)
    assert _kinds(ledger, sent) == ["dead_letter"], "asked through the outcomes topic first"
    ledger._on_outcome(TP(ledger.outcomes, 1), 0, ledger_module.poison_key(TP1.topic, 63).encode(), sent[0][1])
    assert _kinds(ledger, sent) == ["dead_letter", "dlq"]
    assert ledger.watermark.commit_offset(TP1) == 63, "held until the dead letter is confirmed"
    sent[0][2].set_result("ok")
    sent[1][2].set_result("ok")
    await _spin(10)
    assert _kinds(ledger, sent) == ["dead_letter", "dlq", "dead_lettered"]
    assert ledger.watermark.commit_offset(TP1) == 63, "and its dead_lettered event (the marker comes from it)"
    await _confirm_all(sent)
    assert ledger.watermark.commit_offset(TP1) == 64
    ledger._on_outcome(TP(ledger.outcomes, 1), 1, ledger_module.poison_key(TP1.topic, 63).encode(), sent[2][1])
    ledger._on_task(TP1, 63, b"k", PILL, [])  # redelivered after a crash: the marker answers
    assert _kinds(ledger, sent) == ["dead_letter", "dlq", "dead_lettered"]


async def test_a_poison_message_redelivered_while_its_dead_letter_is_on_its_way_is_not_dead_lettered_again():
    """The chaos run's double dead letters: a broker restart's rebalance gave a partition back to the same worker
    while its dead letter was still unconfirmed, and the redelivery, finding no marker yet, sent a second one."""
    ledger, sent = _poison_ledger()
    marker = ledger_module.poison_key(TP1.topic, 63).encode()
    ledger._on_task(TP1, 63, b"k", PILL, [])
    ledger.watermark.handled(TP1, 63)
    ledger._on_outcome(TP(ledger.outcomes, 1), 0, marker, ledger_module.DEAD_LETTER_REQUEST)
    ledger.forget({TP1})  # revoked and assigned again: redelivered from the commit
    ledger.watermark.start(TP1, 63)
    ledger._on_task(TP1, 63, b"k", PILL, [])
    ledger.watermark.handled(TP1, 63)
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
    marker = ledger_module.poison_key(TP1.topic, 63).encode()
    ledger.watermark.start(TP1, 63)
    ledger._on_task(TP1, 63, b"k", PILL, [])
    ledger.watermark.handled(TP1, 63)
    ledger._on_outcome(TP(ledger.outcomes, 1), 10, marker, ledger_module.MARK_EVENT)  # A's, before ours
    ledger._on_outcome(TP(ledger.outcomes, 1), 11, marker, ledger_module.DEAD_LETTER_REQUEST)  # ours
    await _confirm_all(sent)
    assert _kinds(ledger, sent) == ["dead_letter"], "no dead letter: A's is there"
    assert ledger.watermark.commit_offset(TP1) == 64


async def test_a_delivery_confirmed_after_a_revoke_does_not_release_the_hold_of_the_redelivery():
    ledger = _ledger()
    old, new = Sends(), Sends()
    ledger.watermark.handled(TP0, 9)
    ledger._deliver(TP0, 9, [old])
    ledger.forget({TP0})  # revoked, assigned again, redelivered from the commit
    ledger.watermark.start(TP0, 9)
    ledger._deliver(TP0, 9, [new])
    ledger.watermark.handled(TP0, 9)
    old.attempts[0].set_result("ok")
    await _spin()
    assert ledger.watermark.commit_offset(TP0) == 9, "the old delivery released nothing of the new assignment"
    new.attempts[0].set_result("ok")
    await _spin()
    assert ledger.watermark.commit_offset(TP0) == 10


def _event(tp: TP, offset: int, value: bytes, key: bytes = b"k") -> SimpleNamespace:
    return SimpleNamespace(message=SimpleNamespace(tp=tp, topic=tp.topic, offset=offset, headers=[]), key=key, value=value)


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
    assert sorted(ledger._poison) == [(TP1, 5), (TP1, 6), (TP1, 7)]
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
    ledger, sent = _poison_ledger()
    ledger.table = SlowTable()
    marker = ledger_module.poison_key(TP1.topic, 63)
    ledger._on_task(TP1, 63, b"k", PILL, [])
    ledger.watermark.handled(TP1, 63)
    ledger._on_outcome(TP(ledger.outcomes, 1), 0, marker.encode(), ledger_module.DEAD_LETTER_REQUEST)
    assert json.loads(ledger.table[marker])["by"] == "w"
    assert _kinds(ledger, sent) == ["dead_letter"], "no dead letter before the changelog has the marker"
    ledger.table.changelog[0].set_result("ok")
    await _spin(10)
    assert _kinds(ledger, sent) == ["dead_letter", "dlq"]
    await _confirm_all(sent)
    assert _kinds(ledger, sent) == ["dead_letter", "dlq", "dead_lettered"]
    assert ledger.watermark.commit_offset(TP1) == 64


def _lookups(ledger: Ledger, found: object, fail: int = 0) -> list[tuple]:
    """Replace the ledger's look on the dead-letter topic: it answers ``found`` after failing ``fail`` times.
    Returns the lookups made, as (dlq, source, since)."""
    lookups: list[tuple] = []

    async def find(dlq, source, since):  # type: ignore[no-untyped-def]
        lookups.append((dlq, source, since))
        if len(lookups) <= fail:
            raise ConnectionError("broker down")
        return found

    ledger.find_dead_letter = find  # type: ignore[method-assign]
    return lookups


def _begun_by_a_dead_owner(found: object, fail: int = 0) -> tuple[Ledger, list, list]:
    """A ledger whose table says another worker began the dead letter of TP1@63 and never marked it; its DLQ
    lookup answers ``found`` after failing ``fail`` times. Returns (ledger, sent, lookups)."""
    ledger, sent = _poison_ledger()
    ledger.table[ledger_module.poison_key(TP1.topic, 63)] = json.dumps({"sending": 1000.0, "by": "dead"})
    return ledger, sent, _lookups(ledger, found, fail)


async def _redeliver_and_ask(ledger: Ledger, sent: list) -> None:
    marker = ledger_module.poison_key(TP1.topic, 63).encode()
    ledger.watermark.start(TP1, 63)
    ledger._on_task(TP1, 63, b"k", PILL, [])
    ledger.watermark.handled(TP1, 63)
    assert _kinds(ledger, sent) == ["dead_letter"], "a begun dead letter is not a done one: ask"
    ledger._on_outcome(TP(ledger.outcomes, 1), 11, marker, ledger_module.DEAD_LETTER_REQUEST)
    ledger.watermark.handled(TP(ledger.outcomes, 1), 11)


async def test_a_dead_letter_an_owner_sent_before_dying_unmarked_is_marked_not_sent_again():
    """The moderate chaos run's last double dead letter: a worker was SIGKILLed after its dead letter reached the
    topic and before its dead_lettered event did. The next owner finds it there."""
    ledger, sent, lookups = _begun_by_a_dead_owner(found=SimpleNamespace(ref="agent.tasks.a.dlq:3:0"))
    await _redeliver_and_ask(ledger, sent)
    await _confirm_all(sent)
    assert lookups == [("agent.tasks.a.dlq", (TP1.topic, 1, 63), 1000.0)]
    assert _kinds(ledger, sent) == ["dead_letter", "dead_lettered"], "marked, no second dead letter"
    assert ledger.watermark.commit_offset(TP1) == 64


async def test_a_dead_letter_an_owner_began_but_never_sent_is_sent_once(monkeypatch):
    monkeypatch.setattr("agents_stream.kafka.delivery.backoff", lambda attempt, base, cap: 0.0)  # the lookup is retried as a send
    ledger, sent, lookups = _begun_by_a_dead_owner(found=None, fail=2)
    await _redeliver_and_ask(ledger, sent)
    await _spin(20)
    assert len(lookups) == 3, "a failed lookup is retried, the message held meanwhile"
    await _confirm_all(sent)
    assert _kinds(ledger, sent) == ["dead_letter", "dlq", "dead_lettered"]
    assert ledger.watermark.commit_offset(TP1) == 64


async def _dead_letter_whose_send_fails(monkeypatch, found: object) -> tuple[Ledger, list, list]:
    """A poison message whose dead-letter send fails (the broker may have appended it all the same)."""
    monkeypatch.setattr("agents_stream.kafka.delivery.backoff", lambda attempt, base, cap: 0.0)
    ledger, sent = _poison_ledger()
    lookups = _lookups(ledger, found)
    ledger._on_task(TP1, 63, b"k", PILL, [])
    ledger.watermark.handled(TP1, 63)
    ledger._on_outcome(TP(ledger.outcomes, 1), 0, ledger_module.poison_key(TP1.topic, 63).encode(), ledger_module.DEAD_LETTER_REQUEST)
    assert _kinds(ledger, sent) == ["dead_letter", "dlq"]
    sent[1][2].set_exception(ConnectionError("connection lost before the answer"))
    await _confirm_all(sent)
    return ledger, sent, lookups


async def test_a_dead_letter_whose_failed_send_landed_all_the_same_is_not_sent_again(monkeypatch):
    ledger, sent, lookups = await _dead_letter_whose_send_fails(monkeypatch, found=SimpleNamespace(ref="agent.tasks.a.dlq:2:5"))
    assert [lookup[:2] for lookup in lookups] == [("agent.tasks.a.dlq", (TP1.topic, 1, 63))], "looked on the topic before re-sending"
    assert _kinds(ledger, sent) == ["dead_letter", "dlq", "dead_lettered"], "not sent a second time"
    assert ledger.watermark.commit_offset(TP1) == 64


async def test_a_dead_letter_whose_failed_send_did_not_land_is_sent_again(monkeypatch):
    ledger, sent, lookups = await _dead_letter_whose_send_fails(monkeypatch, found=None)
    assert len(lookups) == 1
    assert _kinds(ledger, sent) == ["dead_letter", "dlq", "dlq", "dead_lettered"]
    assert ledger.watermark.commit_offset(TP1) == 64


async def test_a_dead_letter_unanswered_past_the_timeout_is_waited_for_not_sent_again(monkeypatch):
    monkeypatch.setattr(ledger_module, "CONFIRM_TIMEOUT_S", 0.05)
    ledger, sent = _poison_ledger()
    lookups = _lookups(ledger, found=None)
    ledger._on_task(TP1, 63, b"k", PILL, [])
    ledger.watermark.handled(TP1, 63)
    ledger._on_outcome(TP(ledger.outcomes, 1), 0, ledger_module.poison_key(TP1.topic, 63).encode(), ledger_module.DEAD_LETTER_REQUEST)
    sent[0][2].set_result("ok")
    await asyncio.sleep(0.08)  # the timeout passed: the retry waits for the first attempt's answer
    sent[1][2].set_result("ok")  # which comes late, and says it landed
    await _confirm_all(sent)
    assert _kinds(ledger, sent) == ["dead_letter", "dlq", "dead_lettered"] and lookups == []
    assert ledger.watermark.commit_offset(TP1) == 64
