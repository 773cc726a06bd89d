"""Typed internal events: today's records decode, encodings keep their keys and values, broken ones raise one error."""

from __future__ import annotations

import json
import logging
from typing import Any

import pydantic
import pytest

from agents_stream.contract import events as ev
from agents_stream.contract.events import (
    ANSWERS,
    CIRCUITS,
    JOB_EVENTS,
    OUTCOMES,
    ApprovalTimeout,
    CachedAnswer,
    CacheLookup,
    CacheReply,
    CacheStore,
    CallParked,
    CallsDelegated,
    CircuitFailure,
    CircuitHello,
    CircuitProbe,
    CircuitProbeCancel,
    CircuitRateLimited,
    CircuitSuccess,
    CircuitTransition,
    DeadLettered,
    DeadLetterRequest,
    EventDecodeError,
    Family,
    FannedInResult,
    Heartbeat,
    JobDeadline,
    JobTaskResult,
    JournalEntry,
    LeaseExpired,
    OutcomeEvent,
    RecordsExpired,
    StepDone,
    SubtaskResult,
    TaskFailed,
    TaskSucceeded,
    decode,
    decode_answer,
    encode,
    encode_answer,
    read_event,
)
from agents_stream.contract.models import TaskResult, Usage

W = "host:123:abcd1234"
COMMON = {"dispatch": 2, "calls": 3, "usage": {"input_tokens": 10, "output_tokens": 5, "cost": 0.0012}, "route": None}


def outcome(body: dict[str, Any]) -> dict[str, Any]:
    """What Runtime.send_outcome wraps around an executor outcome."""
    return {"schema_version": 1, "worker": W, **body}


# Today's records, copied from their producers (key order as they build them).
OLD: list[tuple[Family[Any], type[ev.InternalEvent], dict[str, Any]]] = [
    # Executor._succeeded
    (OUTCOMES, TaskSucceeded, outcome({**COMMON, "kind": "succeeded", "status": "succeeded", "output": "hi",
                                       "confidence": "high", "source": "primary:p:m-1", "partial": False})),
    # Executor._succeeded from the cache (cached_at)
    (OUTCOMES, TaskSucceeded, outcome({**COMMON, "kind": "succeeded", "status": "succeeded", "output": {"a": 1},
                                       "confidence": "low", "source": "cache:t0", "partial": False,
                                       "cached_at": 1700000000.25})),
    # Executor._run_saga and _run_steps (another key order, a route)
    (OUTCOMES, TaskSucceeded, outcome({**COMMON, "route": "easy: short", "kind": "succeeded", "status": "succeeded",
                                       "partial": False, "output": ["one", "two"], "confidence": "medium",
                                       "source": "checkpoint"})),
    # Executor._partial
    (OUTCOMES, TaskSucceeded, outcome({**COMMON, "kind": "succeeded", "status": "partial", "output": None,
                                       "confidence": "failed", "source": "none", "partial": True,
                                       "error": "every provider of the agent was unavailable"})),
    # Executor._rejected
    (OUTCOMES, TaskFailed, outcome({**COMMON, "usage": {"input_tokens": 0, "output_tokens": 0, "cost": None},
                                    "kind": "failed", "error": "the answer never matched the output schema: x",
                                    "reason": "invalid_output: x", "source": "primary:p"})),
    # Executor._heartbeats
    (OUTCOMES, Heartbeat, outcome({"kind": "heartbeat", "dispatch": 2, "owner": W})),
    # Executor._run_steps and _run_saga checkpoints
    (OUTCOMES, StepDone, outcome({"kind": "step", "dispatch": 2, "index": 0, "output": "first"})),
    (OUTCOMES, StepDone, outcome({"kind": "step", "dispatch": 2, "index": 1,
                                  "output": {"event": "action_succeeded", "step": "pay", "output": None}})),
    # Runtime.scan_leases
    (OUTCOMES, ApprovalTimeout, {"schema_version": 1, "kind": "approval_timeout", "level": 0, "worker": W}),
    (OUTCOMES, LeaseExpired, {"schema_version": 1, "kind": "expired", "dispatch": 4, "worker": W}),
    # Ledger._on_answers (a hit: the table's entry; a miss)
    (OUTCOMES, CacheReply, {"schema_version": 1, "kind": "cache_reply", "dispatch": 1, "worker": W,
                            "answer": {"task_id": "t0", "output": "hi", "source": "primary:p:m", "confidence": "high",
                                       "at": 1700000000.5}}),
    (OUTCOMES, CacheReply, {"schema_version": 1, "kind": "cache_reply", "dispatch": 1, "worker": W, "answer": None}),
    # ledger.DEAD_LETTER_REQUEST and MARK_EVENT
    (OUTCOMES, DeadLetterRequest, {"schema_version": 1, "kind": "dead_letter"}),
    (OUTCOMES, DeadLettered, {"schema_version": 1, "kind": "dead_lettered"}),
    # Runtime.cache_lookup, Ledger._account
    (ANSWERS, CacheLookup, {"schema_version": 1, "kind": "lookup", "task_id": "t1", "dispatch": 1}),
    (ANSWERS, CacheStore, {"schema_version": 1, "kind": "store", "task_id": "t0", "output": "hi",
                           "source": "primary:p:m", "confidence": "medium", "at": 1700000000.5}),
    # orchestrator.fan_in_event: a whole TaskResult, or the failed stub of a task whose result never comes
    (JOB_EVENTS, JobTaskResult, {"schema_version": 1, "kind": "result", "result": json.loads(TaskResult(
        task_id="j/a", agent_name="a", status="succeeded", output="x", source="primary:p:m", job_id="j",
        usage=Usage(input_tokens=1, output_tokens=2, cost=0.5), completed_at="2026-12-01T09:00:00.000Z",
    ).model_dump_json())}),
    (JOB_EVENTS, JobTaskResult, {"schema_version": 1, "kind": "result",
                                 "result": {"task_id": "j/b", "status": "failed", "error": "dead-lettered: x"}}),
    (JOB_EVENTS, JobDeadline, {"schema_version": 1, "kind": "deadline", "worker": W}),
]
# AgentRunner: a tool call parks for approval, calls delegated to other agents; Delegation: a sub-task's result
OLD += [
    (OUTCOMES, CallParked, outcome({"kind": "call_parked", "dispatch": 2, "turn": 1, "call_id": "c1",
                                    "tool": "refund", "reason": "amount 500 > 100"})),
    (OUTCOMES, CallsDelegated, outcome({"kind": "delegated", "dispatch": 2, "turn": 0, "calls": [
        {"id": "c1", "agent": "analyzer", "instruction": "x", "context": None}]})),
    (OUTCOMES, SubtaskResult, {"schema_version": 1, "kind": "subtask_result", "task_id": "t/c1", "agent": "analyzer",
                               "call_id": "c1", "result": {"task_id": "t/c1", "status": "succeeded"}}),
    (OUTCOMES, RecordsExpired, outcome({"kind": "records_expired", "keys": ["t-1", "t-2"]})),
]


def circuit(kind: str, provider: str | None, **fields: Any) -> dict[str, Any]:
    """What Circuits._publish builds."""
    return {"v": 1, "id": "e1", "kind": kind, "provider": provider, "worker": W, "at": 1700000000.5, **fields}


CID = "openai|http://x/v1|m|K"
OLD_CIRCUITS: list[tuple[type[ev.InternalEvent], dict[str, Any]]] = [
    (CircuitHello, circuit("hello", None, providers=[CID], app="app", spend={"a": {"2026-12-01": {"0": 0.25}}})),
    (CircuitTransition, circuit("transition", CID, to="open", opened_at=1700000000.5, closed_at=None, cause=41)),
    (CircuitFailure, circuit("failure", CID, probe_id=None)),
    (CircuitFailure, circuit("failure", CID, probe_id="p1")),
    (CircuitSuccess, circuit("success", CID, probe_id="p1")),
    (CircuitProbe, circuit("probe", CID, probe_id="p1")),
    (CircuitProbeCancel, circuit("probe_cancel", CID, probe_id="p1")),
    (CircuitRateLimited, circuit("rate_limited", CID, until=1700000012.5, retry_after=12.0)),
    (CircuitRateLimited, circuit("rate_limited", CID, until=1700000012.5)),  # a sender without retry_after
]
OLD += [(CIRCUITS, cls, body) for cls, body in OLD_CIRCUITS]
OLD += [
    # AgentRunner.run's journal entries as the previous version sent them (no "journal"): a step checkpoint here,
    # which the ledger keeps in steps_done as it keeps a JournalEntry
    (OUTCOMES, StepDone, outcome({"kind": "step", "dispatch": 2, "index": 0,
                                  "output": {"kind": "turn", "turn": 0, "text": "hi", "calls": []}})),
    # AgentRunner.run's and Summariser.ensure's journal entries
    (OUTCOMES, JournalEntry, outcome({"kind": "step", "dispatch": 2, "index": 1,
                                      "output": {"kind": "tool", "turn": 0, "call_id": "c1", "result": "ok"},
                                      "journal": True})),
]


@pytest.mark.parametrize("family, cls, body", OLD, ids=[f"{f.name}-{b['kind']}-{i}" for i, (f, _, b) in enumerate(OLD)])
def test_todays_records_decode_and_encode_to_the_same_keys_and_values(
    family: Family[Any], cls: type[ev.InternalEvent], body: dict[str, Any],
) -> None:
    """Workers of the old and the new version share the topics: each reads the other's records."""
    event = decode(json.dumps(body).encode(), family)
    assert type(event) is cls
    assert json.loads(encode(event)) == body


def test_every_kind_has_a_record_of_today() -> None:
    """The shapes above cover every kind of every family."""
    for family in (OUTCOMES, ANSWERS, JOB_EVENTS, CIRCUITS):
        assert {b["kind"] for f, _, b in OLD if f is family} == family.kinds


@pytest.mark.parametrize("cls, body", OLD_CIRCUITS[:-1], ids=[b["kind"] for _, b in OLD_CIRCUITS[:-1]])
def test_circuit_events_are_byte_for_byte_what_publish_wrote(cls: type[ev.InternalEvent], body: dict[str, Any]) -> None:
    """The circuits log's records keep their bytes (one producer, one key order)."""
    fields = {k: v for k, v in body.items() if k not in ("v", "kind")}
    assert encode(cls(**fields)) == json.dumps(body).encode()


def test_the_dead_letter_markers_keep_their_bytes() -> None:
    """The two poison markers are the ledger's constants of today, byte for byte."""
    assert encode(DeadLetterRequest()) == json.dumps({"schema_version": 1, "kind": "dead_letter"}).encode()
    assert encode(DeadLettered()) == json.dumps({"schema_version": 1, "kind": "dead_lettered"}).encode()


def test_scan_and_cache_events_keep_their_bytes() -> None:
    """Events with one producer keep that producer's key order, so their bytes are today's."""
    cases = [
        (ApprovalTimeout(level=1, worker=W),
         {"schema_version": 1, "kind": "approval_timeout", "level": 1, "worker": W}),
        (LeaseExpired(dispatch=3, worker=W), {"schema_version": 1, "kind": "expired", "dispatch": 3, "worker": W}),
        (JobDeadline(worker=W), {"schema_version": 1, "kind": "deadline", "worker": W}),
        (CacheLookup(task_id="t", dispatch=1), {"schema_version": 1, "kind": "lookup", "task_id": "t", "dispatch": 1}),
        (CacheStore(task_id="t", output=[1], source="s", confidence="high", at=2.5),
         {"schema_version": 1, "kind": "store", "task_id": "t", "output": [1], "source": "s", "confidence": "high",
          "at": 2.5}),
    ]
    for event, body in cases:
        assert encode(event) == json.dumps(body).encode()


USAGE = Usage(input_tokens=3, output_tokens=4, cost=None)
ANSWER = CachedAnswer(task_id="t0", output={"x": 1}, source="primary:p:m", confidence="medium", at=5.0)
NEW: list[tuple[Family[Any], Any]] = [
    (OUTCOMES, TaskSucceeded(worker=W, dispatch=1, calls=1, usage=USAGE, route=None, status="succeeded", output="a",
                             confidence="high", source="primary:p:m", partial=False)),
    (OUTCOMES, TaskSucceeded(worker=W, dispatch=1, calls=0, usage=USAGE, route="easy: x", status="partial", output=None,
                             confidence="failed", source="none", partial=True, error="e", cached_at=None)),
    (OUTCOMES, TaskSucceeded(worker=W, dispatch=1, calls=0, usage=USAGE, route=None, status="succeeded", output="c",
                             confidence="low", source="cache:t0", partial=False, cached_at=9.5)),
    (OUTCOMES, TaskFailed(worker=W, dispatch=1, calls=2, usage=USAGE, route=None, error="e", reason="r", source="s")),
    (OUTCOMES, Heartbeat(worker=W, dispatch=1, owner=W)),
    (OUTCOMES, StepDone(worker=W, dispatch=1, index=0, output={"event": "action_failed", "step": "s", "error": "x"})),
    (OUTCOMES, JournalEntry(worker=W, dispatch=1, index=2, output={"kind": "summary", "turn": -1, "text": "s"})),
    (OUTCOMES, ApprovalTimeout(level=2, worker=W)),
    (OUTCOMES, LeaseExpired(dispatch=1, worker=W)),
    (OUTCOMES, CacheReply(dispatch=1, worker=W, answer=ANSWER)),
    (OUTCOMES, CacheReply(dispatch=1, worker=W, answer=None)),
    (OUTCOMES, DeadLetterRequest()),
    (OUTCOMES, DeadLettered()),
    (ANSWERS, CacheLookup(task_id="t", dispatch=1)),
    (ANSWERS, CacheStore(task_id="t", output="a", source="s", confidence="high", at=1.0)),
    (JOB_EVENTS, JobTaskResult(result=FannedInResult(task_id="j/a", status="failed", error="x"))),
    (JOB_EVENTS, JobDeadline(worker=W)),
    (CIRCUITS, CircuitHello(id="e", worker=W, at=1.0, providers=[CID], app="a", spend={})),
    (CIRCUITS, CircuitTransition(id="e", provider=CID, worker=W, at=1.0, to="half_open", opened_at=0.5, cause=3)),
    (CIRCUITS, CircuitFailure(id="e", provider=CID, worker=W, at=1.0)),
    (CIRCUITS, CircuitSuccess(id="e", provider=CID, worker=W, at=1.0, probe_id="p")),
    (CIRCUITS, CircuitProbe(id="e", provider=CID, worker=W, at=1.0, probe_id="p")),
    (CIRCUITS, CircuitProbeCancel(id="e", provider=CID, worker=W, at=1.0, probe_id="p")),
    (CIRCUITS, CircuitRateLimited(id="e", provider=CID, worker=W, at=1.0, until=3.0, retry_after=2.0)),
]
NEW += [
    (OUTCOMES, CallParked(worker=W, dispatch=2, turn=0, call_id="c", tool="refund", reason="r")),
    (OUTCOMES, CallsDelegated(worker=W, dispatch=1, turn=0, calls=[{"id": "c", "agent": "a", "instruction": "i"}])),
    (OUTCOMES, SubtaskResult(task_id="t/c", agent="a", call_id="c", result={"status": "failed", "error": "e"})),
    (OUTCOMES, RecordsExpired(keys=["t-1"], worker=W)),
]


@pytest.mark.parametrize("family, event", NEW, ids=[f"{f.name}-{e.kind}-{i}" for i, (f, e) in enumerate(NEW)])
def test_every_kind_round_trips(family: Family[Any], event: Any) -> None:
    """What a new producer encodes, a reader decodes to the same event."""
    assert decode(encode(event), family) == event


def test_the_round_trips_cover_every_kind() -> None:
    for family in (OUTCOMES, ANSWERS, JOB_EVENTS, CIRCUITS):
        assert {e.kind for f, e in NEW if f is family} == family.kinds


def _previous_step_done() -> type[ev.InternalEvent]:
    """StepDone as the previous version declares it, for a journal entry, a step and a saga report alike."""
    from typing import Literal

    class PreviousStepDone(ev.InternalEvent):
        schema_version: int = 1
        kind: Literal["step"] = "step"
        worker: str
        dispatch: int
        index: int
        output: Any

    return PreviousStepDone


def test_a_journal_entry_is_the_previous_versions_step_record_plus_a_field_it_ignores() -> None:
    """Rolling upgrades: a worker of the previous version reads this version's journal entry as the step it always
    was (its decoder is strict and ignores unknown fields), with the same dispatch, index and entry."""
    entry = {"kind": "turn", "turn": 3, "text": None, "calls": [{"id": "c", "name": "refund", "arguments": {}}]}
    raw = encode(JournalEntry(worker=W, dispatch=4, index=7, output=entry))
    previous = _previous_step_done().model_validate_json(raw, strict=True)
    assert previous.model_dump() == {"schema_version": 1, "kind": "step", "worker": W, "dispatch": 4, "index": 7,
                                     "output": entry}
    assert json.loads(raw) == {**json.loads(encode(previous)), "journal": True}
    # ... and the same bytes without the field are what the previous version itself sent for it
    assert json.loads(encode(StepDone(worker=W, dispatch=4, index=7, output=entry))) == json.loads(encode(previous))


def test_a_step_checkpoint_is_the_previous_versions_step_record_byte_for_byte() -> None:
    report = {"event": "action_succeeded", "step": "pay", "output": {"id": 1}}
    raw = encode(StepDone(worker=W, dispatch=1, index=0, output=report))
    assert raw == encode(_previous_step_done().model_validate_json(raw, strict=True))
    assert "journal" not in json.loads(raw)


def test_a_step_record_of_the_previous_version_reads_as_a_step_checkpoint_and_keeps_its_bytes() -> None:
    """Without the field (a step, or a journal entry the previous version sent) the record is a StepDone; the ledger
    keeps its output in steps_done as it keeps a JournalEntry's, so an old worker's journal entry loses nothing."""
    entry = {"kind": "tool", "turn": 0, "call_id": "c", "result": "ok"}
    old = _previous_step_done()(worker=W, dispatch=2, index=1, output=entry)
    event = decode(encode(old), OUTCOMES)
    assert type(event) is StepDone and (event.dispatch, event.index, event.output) == (2, 1, entry)
    assert encode(event) == encode(old)


@pytest.mark.parametrize("marker", [False, None, 1, "true"])
def test_only_journal_true_marks_a_journal_entry(marker: Any) -> None:
    body = outcome({"kind": "step", "dispatch": 1, "index": 0, "output": {"kind": "turn"}, "journal": marker})
    assert type(decode(json.dumps(body), OUTCOMES)) is StepDone


def test_a_journal_entry_is_an_object() -> None:
    body = outcome({"kind": "step", "dispatch": 1, "index": 0, "output": "text", "journal": True})
    with pytest.raises(EventDecodeError, match="output") as info:
        decode(json.dumps(body), OUTCOMES)
    assert info.value.kind == "step"


def test_fields_sent_only_with_a_value_are_left_out_when_none() -> None:
    """cached_at and error (succeeded), retry_after (rate_limited) are absent, not null, when unset; route is null."""
    plain = json.loads(encode(NEW[0][1]))
    assert "cached_at" not in plain and "error" not in plain and plain["route"] is None
    assert json.loads(encode(NEW[2][1]))["cached_at"] == 9.5
    limited = json.loads(encode(CircuitRateLimited(id="e", provider=CID, worker=W, at=1.0, until=3.0)))
    assert "retry_after" not in limited
    assert json.loads(encode(CircuitFailure(id="e", provider=CID, worker=W, at=1.0)))["probe_id"] is None


def test_unknown_fields_are_ignored() -> None:
    """A newer worker's extra fields do not stop an older one from reading the event."""
    for family, _, body in OLD:
        if family is JOB_EVENTS:
            continue  # a result's extra fields ride along (next test)
        later = json.dumps({**body, "added_later": {"x": 1}}).encode()
        assert decode(later, family) == decode(json.dumps(body).encode(), family)


def test_a_fanned_in_result_carries_the_whole_task_result() -> None:
    """The orchestrator's copy of a result keeps every TaskResult field, typed or not."""
    body = OLD[16][2]
    event = decode(json.dumps(body).encode(), JOB_EVENTS)
    assert isinstance(event, JobTaskResult)
    assert (event.result.task_id, event.result.status, event.result.confidence) == ("j/a", "succeeded", "high")
    assert json.loads(encode(event))["result"] == body["result"]
    stub = decode(json.dumps(OLD[17][2]).encode(), JOB_EVENTS)
    assert isinstance(stub, JobTaskResult) and stub.result.confidence is None and stub.result.source is None


def raw_circuit(kind: str, **fields: Any) -> bytes:
    return json.dumps({"v": 1, "id": "x", "kind": kind, "worker": "other", "at": 0, **fields}).encode()


def test_todays_circuits_test_records_decode() -> None:
    """The shapes tests/unit/resilience/test_circuits.py writes (no probe_id, no provider, a hello without providers,
    an int clock) are valid events."""
    failure = decode(raw_circuit("failure", provider=CID), CIRCUITS)
    assert isinstance(failure, CircuitFailure) and failure.probe_id is None and failure.at == 0.0
    hello = decode(json.dumps({"v": 1, "id": "x", "kind": "hello", "worker": "o", "at": 0, "providers": [], "app": "",
                               "spend": {}}), CIRCUITS)
    assert isinstance(hello, CircuitHello) and hello.provider is None
    spend_only = decode(raw_circuit("hello", worker="w1", app="app", spend={"a": {"2026-11-29": {"0": 1.5}}}), CIRCUITS)
    assert isinstance(spend_only, CircuitHello) and spend_only.providers is None, "absent, not an empty list"
    sent = json.loads(raw_circuit("hello", worker="w1", app="app", spend={"a": {"2026-11-29": {"0": 1.5}}}))
    assert json.loads(encode(spend_only)) == {**sent, "provider": None}, "absent stays absent; the envelope is whole"
    bare = decode(json.dumps({"v": 1, "id": "x", "kind": "transition", "worker": "o", "at": 0, "provider": CID,
                              "to": "open", "cause": 1}), CIRCUITS)
    assert isinstance(bare, CircuitTransition) and bare.opened_at is None and bare.closed_at is None


MALFORMED: list[tuple[Family[Any], Any]] = [
    (OUTCOMES, None),  # a tombstone
    (OUTCOMES, b"not json"),
    (OUTCOMES, b"\xff\xfe"),  # not UTF-8
    (OUTCOMES, b"[" * 100_000),  # nested too deeply
    (OUTCOMES, b"[1, 2]"),
    (OUTCOMES, b'"heartbeat"'),
    (OUTCOMES, b'{"schema_version": 1}'),  # no kind
    (OUTCOMES, b'{"schema_version": 1, "kind": 3}'),
    (OUTCOMES, json.dumps(outcome({"kind": "heartbeat", "dispatch": "2", "owner": W}))),
    (OUTCOMES, json.dumps(outcome({"kind": "heartbeat", "dispatch": True, "owner": W}))),
    (OUTCOMES, json.dumps(outcome({"kind": "heartbeat", "dispatch": 2}))),  # no owner
    (OUTCOMES, json.dumps(outcome({"kind": "step", "dispatch": 2, "output": "x"}))),  # no index
    # a delegated call whose agent is no agent name, whose id cannot be part of a task_id, or that is missing
    (OUTCOMES, json.dumps(outcome({"kind": "delegated", "dispatch": 1, "turn": 0,
                                   "calls": [{"id": "c1", "agent": "../x", "instruction": "i"}]}))),
    (OUTCOMES, json.dumps(outcome({"kind": "delegated", "dispatch": 1, "turn": 0,
                                   "calls": [{"id": "c\n1", "agent": "a", "instruction": "i"}]}))),
    (OUTCOMES, json.dumps(outcome({"kind": "delegated", "dispatch": 1, "turn": 0, "calls": [{"id": "c1"}]}))),
    (OUTCOMES, json.dumps({**OLD[0][2], "confidence": "sure"})),
    (OUTCOMES, json.dumps({k: v for k, v in OLD[0][2].items() if k != "confidence"})),  # no longer silently "high"
    (OUTCOMES, json.dumps({**OLD[0][2], "usage": [1]})),
    (OUTCOMES, json.dumps({**OLD[1][2], "cached_at": "yesterday"})),
    (OUTCOMES, json.dumps({**OLD[10][2], "answer": {"task_id": "t0"}})),
    (OUTCOMES, json.dumps({"schema_version": 1, "kind": "approval_timeout", "level": "0", "worker": W})),
    (ANSWERS, json.dumps({"schema_version": 1, "kind": "lookup", "task_id": 7, "dispatch": 1})),
    (JOB_EVENTS, json.dumps({"schema_version": 1, "kind": "result", "result": {"task_id": "j/a"}})),
    (JOB_EVENTS, json.dumps({"schema_version": 1, "kind": "result"})),
    (CIRCUITS, raw_circuit("probe", provider=CID)),  # the bad records of tests/unit/resilience/test_circuits.py
    (CIRCUITS, raw_circuit("rate_limited", provider=CID)),
    (CIRCUITS, raw_circuit("hello", spend=[1])),
    (CIRCUITS, raw_circuit("transition", provider=CID, to="exploded", cause=-5)),
    (CIRCUITS, raw_circuit("failure", provider={"not": "hashable"})),
    (CIRCUITS, json.dumps({"v": 1, "kind": "failure", "provider": CID, "at": 0})),  # no id, no worker
]


@pytest.mark.parametrize("family, raw", MALFORMED, ids=[f"{f.name}-{i}" for i, (f, _) in enumerate(MALFORMED)])
def test_malformed_records_raise_the_one_error(family: Family[Any], raw: Any) -> None:
    """Every way a record can be broken raises EventDecodeError (a ValueError), so readers log and skip it."""
    with pytest.raises(EventDecodeError) as info:
        decode(raw, family)
    assert isinstance(info.value, ValueError) and not info.value.unknown_kind


@pytest.mark.parametrize("family, kind", [(OUTCOMES, "teleported"), (OUTCOMES, "lookup"), (ANSWERS, "heartbeat"),
                                          (JOB_EVENTS, "succeeded"), (CIRCUITS, "result")])
def test_an_unknown_kind_is_a_decode_error_that_says_so(family: Family[Any], kind: str) -> None:
    """A kind not of the family (a newer worker's, or another topic's) is an error readers can tell apart."""
    with pytest.raises(EventDecodeError) as info:
        decode(json.dumps({"schema_version": 1, "v": 1, "kind": kind}), family)
    assert info.value.unknown_kind and info.value.kind == kind and kind in str(info.value)


def test_a_wrong_type_names_the_field() -> None:
    with pytest.raises(EventDecodeError, match="dispatch") as info:
        decode(json.dumps(outcome({"kind": "heartbeat", "dispatch": "2", "owner": W})), OUTCOMES)
    assert info.value.kind == "heartbeat"


def test_the_union_picks_the_model_of_the_kind() -> None:
    """Each kind decodes to its own class, whatever other fields look alike."""
    picked = {decode(json.dumps(b), f).kind: type(decode(json.dumps(b), f)) for f, _, b in OLD if "journal" not in b}
    journal = [type(decode(json.dumps(b), f)) for f, _, b in OLD if "journal" in b]
    assert journal == [JournalEntry], "a step marked as a journal entry is one, whatever its kind says"
    assert picked["expired"] is LeaseExpired and picked["heartbeat"] is Heartbeat and picked["step"] is StepDone
    assert picked["lookup"] is CacheLookup and picked["store"] is CacheStore and picked["deadline"] is JobDeadline
    assert picked["failure"] is CircuitFailure and picked["success"] is CircuitSuccess


def describe(event: OutcomeEvent) -> str:
    """A reader matching on the type, as the ledger does."""
    match event:
        case TaskSucceeded(status="partial"):
            return "partial"
        case TaskSucceeded(confidence=confidence):
            return f"answer:{confidence}"
        case TaskFailed(reason=reason):
            return f"failed:{reason}"
        case Heartbeat(owner=owner):
            return f"alive:{owner}"
        case StepDone(index=index):
            return f"step:{index}"
        case JournalEntry(index=index):
            return f"journal:{index}"
        case CacheReply(answer=None):
            return "miss"
        case CacheReply(answer=CachedAnswer(task_id=task_id)):
            return f"hit:{task_id}"
        case CallParked(tool=tool):
            return f"parked:{tool}"
        case CallsDelegated(calls=calls):
            return f"delegated:{len(calls)}"
        case SubtaskResult(call_id=call_id):
            return f"subresult:{call_id}"
        case RecordsExpired(keys=keys):
            return f"expired:{len(keys)}"
        case ApprovalTimeout() | LeaseExpired() | DeadLetterRequest() | DeadLettered():
            return event.kind
    return "unreachable"


def test_readers_can_match_on_the_type() -> None:
    seen = [describe(decode(json.dumps(b), OUTCOMES)) for f, _, b in OLD if f is OUTCOMES]
    assert seen == [
        "answer:high", "answer:low", "answer:medium", "partial", "failed:invalid_output: x", f"alive:{W}", "step:0",
        "step:1", "approval_timeout", "expired", "hit:t0", "miss", "dead_letter", "dead_lettered",
        "parked:refund", "delegated:1", "subresult:c1", "expired:2", "step:0", "journal:1",
    ]


def test_events_are_frozen() -> None:
    with pytest.raises(pydantic.ValidationError):
        Heartbeat(worker=W, dispatch=1, owner=W).dispatch = 2  # type: ignore[misc]


def test_the_cached_answer_keeps_the_tables_format() -> None:
    """The answers table's entry is the ledger's five keys of today; a store event gives it."""
    store = decode(json.dumps(OLD[15][2]), ANSWERS)
    assert isinstance(store, CacheStore)
    today = json.dumps({k: OLD[15][2][k] for k in ("task_id", "output", "source", "confidence", "at")})
    assert encode_answer(store.answer()) == today
    assert decode_answer(today) == store.answer()
    with pytest.raises(EventDecodeError):
        decode_answer(json.dumps({"task_id": "t0", "output": None, "source": None, "confidence": None, "at": None}))


class TP:
    topic, partition = "agent.outcomes.app", 3


def test_read_event_gives_the_key_and_the_event() -> None:
    body = json.dumps(OLD[5][2]).encode()
    assert read_event(TP(), 7, b"t1", body, OUTCOMES) == ("t1", decode(body, OUTCOMES))


@pytest.mark.parametrize("key, value, logged", [
    (None, json.dumps(OLD[5][2]).encode(), "without a usable key"),
    (b"\xff", json.dumps(OLD[5][2]).encode(), "without a usable key"),
    (b"t1", b"not json", "Skipping malformed outcome event at agent.outcomes.app[3]@7"),
    (b"t1", json.dumps({"schema_version": 1, "kind": "teleported"}).encode(), "unknown kind 'teleported' for t1"),
])
def test_read_event_logs_and_skips_a_broken_record(
    key: bytes | None, value: bytes, logged: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """A broken internal record is logged and skipped: None, never an exception out of the stream loop."""
    with caplog.at_level(logging.WARNING, logger=ev.__name__):
        assert read_event(TP(), 7, key, value, OUTCOMES) is None
    assert logged in caplog.text
