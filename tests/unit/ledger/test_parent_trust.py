"""A task's ``parent`` is producer-written: it is accepted only when provably the caller's (contract.models
parse_task, tables/delegation.py is_from_call), and a sub-task's result never makes its caller's record too large
(docs/security.md, "A task's parent")."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agents_stream.tables import delegation
from agents_stream.tables.leases import AWAITING_SUBTASKS, RUNNING, Control, Dispatch

from agents_stream.contract.errors import PoisonMessage
from agents_stream.contract.models import ParentRef, TaskPayload, parse_task, task_digest
from agents_stream.ledger import sizes
from tests.unit.execution.test_delegation import T0, running


def _task(task_id: str, parent: dict[str, Any]) -> bytes:
    return json.dumps({"task_id": task_id, "agent_name": "analyzer", "instruction": "hi", "parent": parent}).encode()


def test_a_sub_task_whose_id_is_not_derived_from_its_parent_is_refused() -> None:
    with pytest.raises(PoisonMessage) as caught:
        parse_task(_task("x1", {"task_id": "x", "app_id": "app", "call_id": "c1"}), agent="analyzer",
                   max_bytes=10_000)
    assert caught.value.reason == "parent_mismatch" and "'x/c1'" in str(caught.value)
    ok = parse_task(_task("x/c1", {"task_id": "x", "app_id": "app", "call_id": "c1"}), agent="analyzer",
                    max_bytes=10_000)
    assert ok.parent is not None and ok.parent.app_id == "app"


@pytest.mark.parametrize("app_id", ["no such app!", "a/b", "é", "x" * 201, ""])
def test_a_parent_naming_an_app_id_that_is_no_topic_name_component_is_refused(app_id: str) -> None:
    with pytest.raises(PoisonMessage) as caught:
        parse_task(_task("x/c1", {"task_id": "x", "app_id": app_id, "call_id": "c1"}), agent="analyzer",
                   max_bytes=10_000)
    assert caught.value.reason == "schema_violation" and "parent.app_id" in str(caught.value)


SUBS = [TaskPayload(task_id=f"lead-1/{c}", agent_name=a, instruction=f"ask {c}",
                    parent=ParentRef(task_id="lead-1", app_id="app", call_id=c)) for c, a in
        [("c1", "analyzer"), ("c2", "summarizer")]]


def _parked() -> Any:
    subtasks = [(s.parent.call_id, s.agent_name, s.task_id, s.model_dump_json())  # type: ignore[union-attr]
                for s in SUBS]
    digests = {s.parent.call_id: task_digest(s) for s in SUBS}  # type: ignore[union-attr]
    parked, _ = delegation.delegate(running(), dispatch=1, turn=0, subtasks=subtasks, digests=digests)
    return parked


def _arrive(record: Any, call_id: str, agent: str, *, sub_task: str | None = None, digest: str | None = None,
            result: dict[str, Any] | None = None, limit: int | None = None) -> Any:
    arrived = delegation.CallResult(sub_task or f"lead-1/{call_id}", call_id, agent,
                                    result or {"status": "succeeded", "output": "fine"}, digest)
    return delegation.arrive(
        record, arrived, task_id="lead-1", now=T0 + 5, me="w2", ttl=30.0,
        fits=None if limit is None else lambda r: sizes.subresult_too_large(r, limit),
    )


def test_a_result_counts_only_from_the_calls_own_sub_task() -> None:
    """A forged task under the call's derived id but with its own payload (another digest), or a result under
    another task id, changes nothing; the call's own sub-task's result is journaled."""
    parked = _parked()
    forged = task_digest(SUBS[0].model_copy(update={"instruction": "forged"}))
    assert _arrive(parked, "c1", "analyzer", digest=forged) == (parked, []), "another payload's result"
    assert _arrive(parked, "c1", "analyzer", sub_task="lead-2/c1") == (parked, []), "another task's id"
    assert _arrive(parked, "c1", "analyzer", sub_task="lead-1/c2", digest=task_digest(SUBS[0])) == (parked, [])
    one, _ = _arrive(parked, "c1", "analyzer", digest=task_digest(SUBS[0]))
    assert delegation.waiting_for(one) == {"c2": "summarizer"}
    assert "c1" not in json.loads(one.waiting)["digests"], "a call answered needs its digest no more"
    two, effects = _arrive(one, "c2", "summarizer")  # a callee of an older version sends no digest
    assert two.state == RUNNING and Dispatch(2) in effects


def test_a_sub_result_too_large_for_the_callers_record_is_journaled_as_failed() -> None:
    """A sub-result too large for its caller: the caller's record stays one Kafka record; the call reads
    result_too_large, and the loop goes on (the last result still dispatches it)."""
    parked = _parked()
    limit = 64_000
    big = {"status": "succeeded", "output": "x" * 100_000}
    one, effects = _arrive(parked, "c1", "analyzer", result=big, limit=limit)
    entry = json.loads(one.steps_done)[-1]
    assert entry["result"]["status"] == "failed" and entry["result"]["error"].startswith("result_too_large")
    assert "AGENTS_STREAM_RECORD_MAX_BYTES 64000" in entry["result"]["error"]
    assert sizes.record_bytes(one) < limit and one.state == AWAITING_SUBTASKS
    assert [e.event for e in effects if isinstance(e, Control)] == ["agent.subresult_refused"]
    small, _ = _arrive(parked, "c1", "analyzer", result={"status": "succeeded", "output": "ok"}, limit=limit)
    assert json.loads(small.steps_done)[-1]["result"]["output"] == "ok", "a result that fits is kept"
    done, effects = _arrive(one, "c2", "summarizer", result=big, limit=limit)
    assert done.state == RUNNING and Dispatch(2) in effects and sizes.record_bytes(done) < limit


async def test_a_finished_sub_task_sends_its_digest_and_a_task_squatting_its_id_tells_the_caller_with_its_own():
    """The callee's ledger sends the digest of the task that ran; a task refused as another task under a
    sub-task's id tells the caller it failed, under its own digest: the caller counts that only when it is the
    payload it delegated (a squatter cannot leave the real caller waiting, a forger cannot answer it)."""
    from faust.types import TP

    from agents_stream.contract import topics
    from agents_stream.contract.events import OUTCOMES, SubtaskResult, decode, encode
    from agents_stream.execution import run as outcome
    from agents_stream.execution.run import Rejected, Run
    from tests.unit.ledger.test_sub_tasks import MINE, SETTINGS, SUB, _ledger, _spin
    from tests.unit.ledger_fakes import faust_event

    ledger, _, _, sent, _ = _ledger(SUB)
    failed = outcome.rejected(Run(SUB, 1, "w2"), Rejected("permanent_error: 400", "refused", "primary:p"))
    ledger.handle(faust_event(TP(MINE, 0), 5, SUB.task_id.encode(), encode(failed)))
    await _spin()
    other = SUB.model_copy(update={"instruction": "something else"})
    key = other.task_id.encode()
    part = topics.partition_for(key, SETTINGS.partitions)
    ledger.handle(faust_event(TP(topics.task_topic("analyzer"), part), 9, key, other.model_dump_json().encode()))
    await _spin()
    back = [decode(v or b"", OUTCOMES) for t, v in sent if t == topics.outcomes_topic("caller-app")]
    assert all(isinstance(b, SubtaskResult) for b in back) and len(back) == 2
    assert back[0].digest == task_digest(SUB)  # type: ignore[union-attr]
    assert back[1].digest == task_digest(other)  # type: ignore[union-attr]
    assert "task_id_conflict" in back[1].result["error"]  # type: ignore[union-attr]
