"""Bounded parking and approvals that say who and where, without a broker: links bound
to one parking at one level, signed decisions, the secret's minimum length, the per-agent cap, the due-time index,
the webhook pacer, control characters, and where a requeue may send."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import pytest
from agents_stream.tables import approvals, leases
from agents_stream.tables.definitions import Tables
from faust.types import TP
from pydantic import ValidationError

from agents_stream import settings as settings_module
from agents_stream.config import ApprovalLevel, ApprovalPolicy
from agents_stream.contract import topics
from agents_stream.contract.models import ApprovalDecision
from agents_stream.kafka.deadletters import DeadLetter
from agents_stream.kafka.outbox import Outbox
from agents_stream.kafka.watermark import Watermark
from agents_stream.ledger import scanner as scanning
from agents_stream.ledger.app_agents import AppAgents
from agents_stream.ledger.ledger import Ledger
from agents_stream.ops import cli_common, dlq
from agents_stream.ops import notify as links
from agents_stream.orchestrator import JobRequest
from agents_stream.settings import Settings
from tests.unit.ledger_fakes import ConfirmingChannel, FakeRuns, FaustEvent, PlainTable, Table, faust_event

SECRET = "a-secret-of-at-least-thirty-two-characters"
AGENT = "refunds"
TP0 = TP(topics.task_topic(AGENT), 0)
T0 = 1_000.0


def parked_record(now: float = T0, timeouts: tuple[float, ...] = (10.0, 20.0)) -> leases.TaskRecord:
    record, _ = leases.receive(
        None, leases.TaskMessage(agent=AGENT, payload='{"task_id":"r-1","agent_name":"refunds","instruction":"x"}',
                                 topic=TP0.topic, partition=0, offset=5),
        now=now, me="w1", ttl=30.0, max_attempts=3, running_here=False,
        approval=("amount 500 > 100", list(timeouts)),
    )
    assert record is not None
    return record


# -- links: one parking, one level ----------------------------------------------------------------

def test_a_link_names_its_parking_and_a_requeued_parking_refuses_it():
    """The link carries when the task was parked; a decision bound to an earlier parking (the task was requeued
    and parked again) or another level does not decide it, and says why."""
    first = parked_record(T0)
    url = links.link("http://w", SECRET, "r-1", "approve", 0, "lead", 2_000, approvals.parked_ms_of(first), "app",
                     AGENT)
    claim = links.verify(SECRET, "r-1", "approve", dict(_query(url)), now=1_500)
    assert claim == links.LinkClaim(0, "lead", 1_000_000, "app", AGENT)

    def problem_of(record: leases.TaskRecord, level: int | None) -> str | None:
        return approvals.binding_problem(record, here="app", app_id=claim.app_id, agent=claim.agent,
                                         parked=claim.parked, level=level)

    assert problem_of(first, claim.level) is None
    again = parked_record(T0 + 60)  # requeued and parked again: new links
    problem = problem_of(again, claim.level)
    assert problem is not None and "another parking" in problem
    escalated, _ = approvals.escalate(first, level=0, timeouts=(10.0, 20.0), now=T0 + 11, rejected_result="{}")
    assert problem_of(escalated, 0) == "the decision is for level 1; the task now awaits level 2"


def test_a_changed_parking_breaks_the_links_signature():
    url = links.link("http://w", SECRET, "r-1", "approve", 0, "lead", 2_000, 1_000_000, "app", AGENT)
    for changed in ({"parked": "1000001"}, {"app": "other-app"}, {"agent": "other-agent"}):
        with pytest.raises(links.LinkError, match="signature"):
            links.verify(SECRET, "r-1", "approve", {**dict(_query(url)), **changed}, now=1_500)
    with pytest.raises(links.LinkError, match="parked"):
        links.verify(SECRET, "r-1", "approve", {k: v for k, v in _query(url) if k != "parked"}, now=1_500)


# -- signed decisions ----------------------------------------------------------------------------

def test_a_signed_decision_verifies_and_any_change_or_another_secret_does_not():
    made = ApprovalDecision(task_id="r-1", decision="approve", by="carol", via="cli", comment="ok", parked=5,
                            app_id="app", agent=AGENT)
    signed = links.with_signature(SECRET, made)
    fields = signed.model_dump(include={"task_id", "decision", "by", "via", "comment", "level", "parked", "agent",
                                        "app_id"})
    assert links.decision_signed(SECRET, signed.sig, **fields)
    for changed in ({"by": "mallory"}, {"decision": "reject"}, {"parked": 6}, {"app_id": "b"}, {"agent": "x"},
                    {"app_id": None}, {"agent": None}):
        assert not links.decision_signed(SECRET, signed.sig, **{**fields, **changed}), changed
    assert not links.decision_signed(SECRET + "x", signed.sig, **fields)
    assert not links.decision_signed(SECRET, None, **fields), "no signature: unsigned"
    assert not links.decision_signed("", signed.sig, **fields), "no secret to check with: unsigned"
    assert links.with_signature("", made).sig is None
    link_sig = links.sign(SECRET, "r-1", "approve", 0, "carol", 0, 0, "app", AGENT)
    assert not links.decision_signed(SECRET, link_sig, **fields), "a link's signature is no decision signature"


def test_the_approval_secret_has_a_minimum_length():
    """A short secret is refused with the length it needs; unset (no links) and long enough are fine."""
    least = settings_module.APPROVAL_SECRET_MIN_CHARS
    problem = Settings(approval_secret="link-secret").approval_secret_problem()
    assert problem is not None and f"at least {least}" in problem and "link-secret" not in problem
    assert Settings(approval_secret="").approval_secret_problem() is None
    assert Settings(approval_secret="x" * least).approval_secret_problem() is None


# -- control characters and terminal output --------------------------------------------------------

@pytest.mark.parametrize("field", ["by", "comment", "via"])
@pytest.mark.parametrize("text", ["eve\x1b[2J", "line\nbreak", "cr\rhere", "c1\x9bx", "del\x7f"])
def test_decisions_refuse_control_characters(field, text):
    base = {"task_id": "r-1", "decision": "approve", "by": "carol"}
    with pytest.raises(ValidationError, match="pattern"):
        ApprovalDecision.model_validate({**base, field: text})


def test_a_job_cancel_refuses_control_characters_in_who_and_why():
    with pytest.raises(ValidationError):
        JobRequest.model_validate({"job_id": "j1", "action": "cancel", "by": "x\x1b]0;owned\x07"})
    with pytest.raises(ValidationError):
        JobRequest.model_validate({"job_id": "j1", "action": "cancel", "reason": "a\nb"})


def test_terminal_output_escapes_control_characters():
    assert cli_common.printable("r-1\x1b[2J\r\nok") == "r-1\\x1b[2J\\x0d\\x0aok"
    assert cli_common.printable_tree({"k\x1b": ["a\x07", 3, None]}) == {"k\\x1b": ["a\\x07", 3, None]}


# -- where a requeue may send --------------------------------------------------------------------

def test_a_requeue_goes_only_to_the_agents_own_task_topic():
    """The original_topic header is whatever its writer set: it never picks the target."""
    planted = DeadLetter(topic=topics.dlq_topic(AGENT), partition=0, offset=1, key=b"r-1", value=b"{}",
                         headers={"original_topic": topics.APPROVALS})
    assert dlq.requeue_target(planted) == topics.task_topic(AGENT)
    other = DeadLetter(topic=topics.dlq_of(topics.APPROVALS), partition=0, offset=1, key=b"r-1", value=b"{}",
                       headers={"original_topic": topics.task_topic(AGENT)})
    with pytest.raises(ValueError, match="not on an agent's dead-letter topic"):
        dlq.requeue_target(other)
    with pytest.raises(ValueError):
        dlq.parse_ref(f"{topics.dlq_of(topics.APPROVALS)}:0:1")


# -- the due-time index ----------------------------------------------------------------------------

def test_the_index_returns_only_due_levels_drops_stale_entries_and_asks_again_later():
    index = scanning.DueIndex()
    index.put("a", scanning.ParkedTask(TP0, AGENT, 0, 10.0))
    index.put("b", scanning.ParkedTask(TP0, AGENT, 0, 50.0))
    assert index.due(9.0, retry_after=5.0) == []
    assert index.due(10.0, retry_after=5.0) == [("a", 0)]
    assert index.due(12.0, retry_after=5.0) == [], "asked once: not again before retry_after"
    assert index.due(15.0, retry_after=5.0) == [("a", 0)], "still unanswered: asked again"
    index.put("a", scanning.ParkedTask(TP0, AGENT, 1, 40.0))  # escalated: the level-0 entries are stale
    assert index.due(30.0, retry_after=5.0) == []
    assert index.due(45.0, retry_after=5.0) == [("a", 1)]
    index.drop("b")
    assert index.due(60.0, retry_after=100.0) == [("a", 1)]
    assert index.waiting(TP0, AGENT) == 1
    index.forget({TP0})
    assert index.waiting(TP0, AGENT) == 0 and index.due(1e9, retry_after=1.0) == []


class CountingTable(PlainTable):
    """A table that counts reads, to show which scans read it."""

    reads = 0

    def get(self, key: str, default: Any = None, /) -> Any:
        CountingTable.reads += 1
        return super().get(key, default)

    def keys(self) -> Any:
        CountingTable.reads += 1
        return super().keys()


def test_scanning_parked_tasks_reads_no_table_after_the_reindex():
    """scan_parked answers from the due-time index: the tables are read once per rebalance, not each scan."""
    tasks, timers = CountingTable(), CountingTable()
    for i in range(50):
        record = parked_record(T0 + i)
        tasks[f"r-{i}"] = record.to_json()
        timers[f"task/r-{i}"] = {"kind": "task"}
    scanner = scanning.Scanner(Settings(), FakeRuns(), tasks, timers)
    assert scanner.reindex() == 50
    CountingTable.reads = 0
    assert scanner.scan_parked(T0 + 5) == []
    assert sorted(scanner.scan_parked(T0 + 12)) == [(f"r-{i}", 0) for i in (0, 1, 2)]
    assert CountingTable.reads == 0, "no table read while scanning"
    assert scanner.approvals_pending([AGENT]) == {AGENT: 50} and scanner.awaiting_in(TP0, AGENT) == 50


class ClosedOnce(Table):
    """A timers table whose first listing fails, as a store the next rebalance closed does."""

    failures = 1

    def keys(self) -> Any:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("the store of this partition is closed")
        return super().keys()


async def test_a_reindex_that_cannot_read_the_table_does_not_raise_and_the_next_scan_reads_it():
    """after_rebalance runs inside Faust's recovery, where an exception would crash the worker: it logs, and the
    parked tasks join the index at the next scan, whose timeouts then come due as before."""
    tasks, timers = Table(), ClosedOnce()
    tasks["r-0"] = parked_record(T0).to_json()
    timers["task/r-0"] = {"kind": "task"}
    scanner = scanning.Scanner(Settings(), FakeRuns(), tasks, timers)
    scanner.after_rebalance()
    assert scanner.reindex_due and scanner.approvals_pending([AGENT]) == {AGENT: 0}
    assert scanner.scan_parked(T0 + 12) == [("r-0", 0)]
    assert not scanner.reindex_due and scanner.approvals_pending([AGENT]) == {AGENT: 1}


# -- the cap: the agent's share of a partition -----------------------------------------------------

def test_the_cap_is_split_evenly_over_the_partitions():
    assert Settings(approval_max_awaiting=10, partitions=4).approval_share() == 3
    assert Settings(approval_max_awaiting=1, partitions=8).approval_share() == 1
    assert Settings(approval_max_awaiting=0).approval_share() == 0


async def test_a_task_over_the_agents_share_is_dead_lettered_not_parked():
    """With the agent's share of the partition parked, the next task gets a failed result and a dead letter
    (approval_backlog_full, layer approval), no notification; once a decision frees a place, the next one parks."""
    ledger, tasks, sent = _ledger(Settings(approval_max_awaiting=2, partitions=1, approval_secret=SECRET))
    for i in range(3):
        ledger.handle(_task_event(i, f"r-{i}"))
    await _spin()
    assert [tasks[f"r-{i}"]["state"] for i in range(3)] == ["awaiting_approval"] * 2 + ["dead_lettered"]
    dead = [(t, h) for t, _, h in sent if t == topics.dlq_topic(AGENT)]
    assert len(dead) == 1 and dict(dead[0][1])["error_layer"] == b"approval"
    assert dict(dead[0][1])["error_reason"].startswith(b"approval_backlog_full: 2 tasks of agent refunds")
    (result,) = [json.loads(v) for t, v, _ in sent if t == topics.RESULTS]
    assert (result["task_id"], result["status"], result["source"]) == ("r-2", "failed", "approval")
    assert "approval_backlog_full" in result["error"]
    assert [json.loads(v)["event"] for t, v, _ in sent if t == topics.CONTROL] == [
        "approval.requested", "approval.requested", "approval.refused",
    ]
    decision = links.with_signature(SECRET, decision_for(tasks, "r-0", "reject", by="carol", via="cli"))
    ledger.handle(_event(TP(topics.APPROVALS, 0), 1, b"r-0", decision.model_dump_json().encode()))
    ledger.handle(_task_event(3, "r-3"))
    await _spin()
    assert tasks["r-3"]["state"] == "awaiting_approval", "a decision frees a place"


async def test_unsigned_decisions_are_recorded_so_and_refused_when_signatures_are_required():
    """A decision with no valid signature is applied and recorded as signed: false (and logged); under
    AGENTS_STREAM_APPROVAL_REQUIRE_SIGNED it is ignored with its reason. A signed one is recorded as signed."""
    for required in (False, True):
        ledger, tasks, sent = _ledger(Settings(partitions=1, approval_secret=SECRET, approval_require_signed=required))
        ledger.handle(_task_event(0, "r-0"))
        ledger.handle(_task_event(1, "r-1"))
        forged = decision_for(tasks, "r-0", "approve", by="ops", via="cli", sig="0" * 64)
        ledger.handle(_event(TP(topics.APPROVALS, 0), 1, b"r-0", forged.model_dump_json().encode()))
        genuine = links.with_signature(SECRET, decision_for(tasks, "r-1", "reject", by="carol"))
        ledger.handle(_event(TP(topics.APPROVALS, 0), 2, b"r-1", genuine.model_dump_json().encode()))
        await _spin()
        controls = {json.loads(v)["subject"]: json.loads(v) for t, v, _ in sent if t == topics.CONTROL}
        assert tasks["r-1"]["state"] == "rejected" and controls["r-1"]["details"]["signed"] is True
        if required:
            assert tasks["r-0"]["state"] == "awaiting_approval"
            assert controls["r-0"]["event"] == "approval.ignored"
            assert "not signed" in controls["r-0"]["details"]["reason"]
        else:
            assert tasks["r-0"]["state"] == "running"
            decided = approvals.state(leases.TaskRecord.from_json(tasks["r-0"]))["decision"]
            assert decided["signed"] is False and controls["r-0"]["details"]["signed"] is False


async def test_a_link_decision_for_another_parking_changes_nothing():
    ledger, tasks, sent = _ledger(Settings(partitions=1, approval_secret=SECRET))
    ledger.handle(_task_event(0, "r-0"))
    stale = links.with_signature(SECRET, ApprovalDecision(
        task_id="r-0", decision="approve", by="lead", via="link", level=0, parked=1, app_id="agents-stream",
        agent=AGENT,
    ))
    ledger.handle(_event(TP(topics.APPROVALS, 0), 1, b"r-0", stale.model_dump_json().encode()))
    await _spin()
    assert tasks["r-0"]["state"] == "awaiting_approval"
    ignored = [json.loads(v) for t, v, _ in sent if t == topics.CONTROL and b"approval.ignored" in (v or b"")]
    assert len(ignored) == 1 and "another parking" in ignored[0]["details"]["reason"]


# -- the webhook pacer ------------------------------------------------------------------------------

def test_the_pacer_starts_at_most_rate_posts_per_second():
    pacer = links.Pacer(4.0)
    assert pacer.wait(10.0) == 0.0
    assert pacer.wait(10.1) == pytest.approx(0.15)
    assert pacer.wait(10.25) == 0.0
    pacer = links.Pacer(4.0)
    starts = [t / 100 for t in range(1000, 1200) if pacer.wait(t / 100) == 0.0]  # 2 s of asking every 10 ms
    assert len(starts) == 8


# -- helpers ---------------------------------------------------------------------------------------

def decision_for(
    tasks: Table, task_id: str, verb: Literal["approve", "reject", "cancel"], **fields: Any,
) -> ApprovalDecision:
    """A decision naming what /approvals shows of the task now: this app id (the default), its agent, its parking."""
    record = leases.TaskRecord.from_json(tasks[task_id])
    return ApprovalDecision(task_id=task_id, decision=verb, app_id=Settings().app_id, agent=record.agent,
                            parked=approvals.parked_ms_of(record), **fields)


def _query(url: str) -> list[tuple[str, str]]:
    from urllib.parse import parse_qsl, urlsplit

    return parse_qsl(urlsplit(url).query)



def _ledger(settings: Settings) -> tuple[Ledger, Table, list[tuple[str, bytes | None, Any]]]:
    """A ledger with an approval policy for every task of AGENT, whose sends are kept as (topic, value, headers)."""
    sent: list[tuple[str, bytes | None, Any]] = []

    def channel(topic: str) -> ConfirmingChannel:
        return ConfirmingChannel(topic, lambda topic, key, value, headers: sent.append((topic, value, headers or [])))

    async def no_lookup(dlq: str, source: tuple[str, int, int], since: float) -> None:
        raise AssertionError("a first dead letter looks nothing up")

    outbox = Outbox(channel, Watermark(), "w1", find_dead_letter=no_lookup)
    tasks = Table()
    tables = Tables(tasks=tasks, answers=Table(), jobs=Table(), timers=Table())
    policy = ApprovalPolicy(always=True, levels=[ApprovalLevel(name="lead", timeout_s=60)])
    ledger = Ledger(
        settings, executor=FakeRuns(), worker_id="w1", tables=tables, watermark=outbox.watermark,
        outbox=outbox, notifier=links.Notifier(), agents=AppAgents(policies={AGENT: policy}),
    )
    return ledger, tasks, sent


def _event(tp: TP, offset: int, key: bytes, value: bytes) -> FaustEvent:
    return faust_event(tp, offset, key, value)


def _task_event(offset: int, task_id: str) -> FaustEvent:
    body = json.dumps({"task_id": task_id, "agent_name": AGENT, "instruction": "refund"}).encode()
    return _event(TP0, offset, task_id.encode(), body)


async def _spin() -> None:
    for _ in range(10):
        await asyncio.sleep(0)
