"""Human approval: the policy, the parked task's decisions and escalations (pure), and signed links."""

from __future__ import annotations

import json

import pytest
from agents_stream.tables import approvals, leases
from agents_stream.tables.leases import (
    AWAITING_APPROVAL,
    REJECTED,
    RUNNING,
    Control,
    Dispatch,
    EmitResult,
    Notify,
    Track,
)

from agents_stream.config import ApprovalPolicy
from agents_stream.ops import notify as links

PAYLOAD = '{"task_id":"r-1","agent_name":"refunds","instruction":"refund order 7"}'
T0 = 1_000.0
TIMEOUTS = (10.0, 20.0)
REJECTED_JSON = '{"task_id":"r-1","status":"failed"}'

MESSAGE = leases.TaskMessage(agent="refunds", payload=PAYLOAD, topic="agent.tasks.refunds", partition=1, offset=5)


def parked(now: float = T0):
    return leases.receive(
        None, MESSAGE, now=now, me="w1", ttl=30.0, max_attempts=3, running_here=False,
        approval=("amount 500 > 100", list(TIMEOUTS)),
    )


def decide(record, decision="approve", by="alice", now=T0 + 1):
    return approvals.decide(
        record, decision=decision, by=by, via="http", comment=None, now=now, me="w2", ttl=30.0,
        rejected_result=REJECTED_JSON,
    )


def escalate(record, level, now):
    return approvals.escalate(record, level=level, timeouts=TIMEOUTS, now=now, rejected_result=REJECTED_JSON)


def policy(**kw):
    base = {"always": False, "risk_at_least": None, "amount_field": None, "amount_above": None, "saga_flagged": False,
            "risk_level": None, "context_data": {}}
    return approvals.needs_approval(**{**base, **kw})


def test_policy_rules_each_match_and_name_themselves():
    """Risk at or above the threshold, an amount above the limit, a flagged saga or `always` each require approval."""
    assert policy() is None
    assert policy(always=True) == "policy: always"
    assert policy(risk_at_least="high", risk_level="critical") == "risk_level critical >= high"
    assert policy(risk_at_least="high", risk_level="medium") is None
    assert policy(risk_at_least="high", risk_level=None) is None
    assert policy(amount_field="amount", amount_above=100, context_data={"amount": 250.5}) == "amount 250.5 > 100"
    assert policy(amount_field="amount", amount_above=100, context_data={"amount": 100}) is None
    assert policy(amount_field="amount", amount_above=100, context_data={"amount": "900.50"}) == "amount 900.5 > 100"
    assert policy(amount_field="amount", amount_above=100, context_data={"amount": " 90 "}) is None
    assert policy(saga_flagged=True, risk_at_least="low",
                  risk_level="low") == "risk_level low >= low; saga step flagged for approval"


def test_a_task_without_the_amount_needs_a_human():
    """A refund whose context has no amount is not waved through: the amount rule asks for approval,
    alone or beside the other rules that match."""
    assert policy(amount_field="amount", amount_above=100, context_data={}) == "amount is missing"
    assert policy(amount_field="amount", amount_above=100, context_data={"total": 5000}) == "amount is missing"
    assert policy(amount_field="amount", amount_above=100, risk_at_least="high", risk_level="critical",
                  context_data={}) == "risk_level critical >= high; amount is missing"
    assert policy(amount_field=None, amount_above=None, context_data={}) is None  # no amount rule, no reason


@pytest.mark.parametrize("amount", ["lots", float("nan"), float("inf"), [500], {"usd": 500}, True, None])
def test_an_amount_the_rule_cannot_read_needs_a_human(amount):
    """A refund of "lots", NaN or a list is not waved through: the amount rule asks for approval."""
    reason = policy(amount_field="amount", amount_above=100, context_data={"amount": amount})
    assert reason is not None and reason.startswith("amount is not a number")


def test_policy_config_needs_amount_field_and_limit_together():
    """A half-configured amount rule is a config error, not a silent no-op."""
    with pytest.raises(ValueError, match="amount_field and amount_above together"):
        ApprovalPolicy(amount_field="amount", levels=[{"name": "lead", "timeout_s": 5}])
    with pytest.raises(ValueError):
        ApprovalPolicy(levels=[])


def test_a_caught_task_is_parked_not_dispatched_and_its_offset_not_held():
    """The parked record is the task's recorded state: no dispatch, no lease, no tracked offset; level 0 is notified."""
    record, effects = parked()
    assert record.state == AWAITING_APPROVAL and record.dispatch == 0 and record.lease_until == 0.0
    assert not any(isinstance(e, (Dispatch, Track)) for e in effects)
    assert Notify(0) in effects
    assert Control("approval.requested", {"reason": "amount 500 > 100", "level": 0, "due": T0 + 10}) in effects
    state = approvals.state(record)
    assert state["level"] == 0 and state["due"] == T0 + 10 and state["decision"] is None


def test_a_redelivered_parked_task_changes_nothing():
    """Redelivery of a task waiting for a human neither dispatches it nor parks it again."""
    record, _ = parked()
    again, effects = leases.receive(
        record, MESSAGE, now=T0 + 5, me="w3", ttl=30.0, max_attempts=3, running_here=False,
        approval=("amount 500 > 100", [10.0]),
    )
    assert again == record and effects == []


def test_approve_dispatches_once_and_records_who():
    """Approval starts dispatch 1 under a lease; the decision (who, how, level) is kept on the record."""
    record, _ = parked()
    running, effects = decide(record)
    assert (
        running.state == RUNNING and running.dispatch == 1 and running.owner == "w2" and running.lease_until == T0 + 31
    )
    assert effects == [Control("approval.decided", {"decision": "approve", "by": "alice", "via": "http", "level": 0,
                                                    "signed": True}), Dispatch(1)]
    assert approvals.state(running)["decision"]["by"] == "alice"
    # a second decision, either way, is ignored
    assert decide(running, "reject", "bob") == (running, [])
    assert decide(running, "approve", "bob") == (running, [])


def test_reject_ends_the_task_with_a_failed_result_and_no_call():
    """A rejected task never runs: terminal REJECTED, its failed result emitted, no dispatch and no dead letter."""
    record, _ = parked()
    rejected, effects = decide(record, "reject", "bob")
    assert rejected.state == REJECTED and rejected.terminal and rejected.result == REJECTED_JSON
    assert EmitResult(REJECTED_JSON) in effects
    assert not any(isinstance(e, (Dispatch, leases.DeadLetter)) for e in effects)
    # a redelivery re-emits the stored result and never dispatches
    again, effects = leases.receive(
        rejected, MESSAGE, now=T0 + 9, me="w1", ttl=30.0, max_attempts=3, running_here=False, approval=("x", [1.0]),
    )
    assert effects == [EmitResult(REJECTED_JSON)]


def test_timeouts_escalate_level_by_level_then_reject():
    """Each level gets its own timeout and notification; the last timeout rejects by "timeout"."""
    record, _ = parked()
    assert approvals.due(record, T0 + 9.9) is None
    assert approvals.due(record, T0 + 10) == 0
    assert escalate(record, 0, T0 + 9) == (record, [])  # not yet due
    level1, effects = escalate(record, 0, T0 + 10)
    assert Notify(1) in effects
    assert Control("approval.escalated", {"from": 0, "to": 1, "due": T0 + 30}) in effects
    assert approvals.state(level1)["level"] == 1 and approvals.due(level1, T0 + 29) is None
    # a late or repeated timeout for level 0 changes nothing
    assert escalate(level1, 0, T0 + 50) == (level1, [])
    final, effects = escalate(level1, 1, T0 + 30)
    assert final.state == REJECTED and EmitResult(REJECTED_JSON) in effects
    decision = approvals.state(final)["decision"]
    assert decision["by"] == "timeout" and decision["level"] == 1
    assert [e["to"] for e in approvals.state(final)["escalations"]] == [1]


def test_a_parked_task_keeps_its_levels_through_a_config_change():
    """Escalation follows the timeouts stored when the task was parked, even if the policy is gone."""
    record, _ = parked()
    level1, effects = approvals.escalate(record, level=0, timeouts=[], now=T0 + 10, rejected_result=REJECTED_JSON)
    assert Notify(1) in effects and approvals.state(level1)["due"] == T0 + 10 + TIMEOUTS[1]
    final, _ = approvals.escalate(level1, level=1, timeouts=[], now=T0 + 30, rejected_result=REJECTED_JSON)
    assert final.state == REJECTED


def test_approval_at_level_two_records_that_level():
    """Approved after one escalation: the decision says level 1 (the second level)."""
    record, _ = parked()
    level1, _ = escalate(record, 0, T0 + 10)
    running, effects = decide(level1, "approve", "manager", now=T0 + 12)
    assert running.state == RUNNING and Dispatch(1) in effects
    assert approvals.state(running)["decision"]["level"] == 1


def test_a_non_ascii_signature_is_refused_not_an_error():
    url = links.link("http://w", SECRET, "r-1", "approve", 0, "lead", 2_000, PARKED, "shop", "refunds")
    fields = {**fields_of(url), "sig": "é" * 64}
    with pytest.raises(links.LinkError, match="signature"):
        links.verify(SECRET, "r-1", "approve", fields, now=1_000)


def test_slack_text_cannot_forge_links_from_task_fields():
    """Task ids and reasons come from producers: <, >, & and backticks are escaped in what Slack parses."""
    body = links.slack_message(task_id="x` <https://evil.example|Approve here>", agent="refunds", reason="a & b",
                               level=0, level_name="lead", due=0.0, instruction="", links=None)
    parsed = body["text"] + body["blocks"][0]["text"]["text"]
    assert "<https" not in parsed and "`" not in parsed and "&lt;https://evil.example|Approve here&gt;" in parsed
    assert "a &amp; b" in parsed
    assert body["task_id"] == "x` <https://evil.example|Approve here>"  # the raw id for machines


def test_a_parked_task_ignores_outcomes_heartbeats_and_expiry():
    """Nothing runs while parked, so no executor event can finish, renew or re-dispatch it."""
    record, _ = parked()
    assert leases.finish(record, status="succeeded", result="{}", reason=None, now=T0)[0] == record
    assert leases.heartbeat(record, dispatch=0, owner="x", now=T0, ttl=30)[0] == record
    assert leases.expire(record, dispatch=0, now=T0 + 99, me="x", ttl=30, max_attempts=3,
                         running_here=False) == (record, [])
    assert leases.checkpoint(record, index=0, output="x")[0] == record


def test_record_round_trips_with_its_approval():
    record, _ = parked()
    assert leases.TaskRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


# -- signed links ----------------------------------------------------------------------------

SECRET = "s3cret-of-at-least-32-characters-x"
PARKED = 1_000_000


def fields_of(url: str) -> dict[str, str]:
    from urllib.parse import parse_qsl, urlsplit

    return dict(parse_qsl(urlsplit(url).query))


def test_a_genuine_link_verifies_to_its_level_and_approver():
    url = links.link("http://w:6066/", SECRET, "r/1 x", "approve", 1, "manager", 2_000, PARKED, "shop", "refunds")
    assert url.startswith("http://w:6066/approvals/r%2F1%20x/approve?")
    claim = links.verify(SECRET, "r/1 x", "approve", fields_of(url), now=1_999)
    assert claim == (1, "manager", PARKED, "shop", "refunds")


@pytest.mark.parametrize("change, message", [
    ({"level": "0"}, "signature"),
    ({"by": "intern"}, "signature"),
    ({"exp": "9999999"}, "signature"),
    ({"sig": "0" * 64}, "signature"),
    ({"parked": str(PARKED + 1)}, "signature"),
    ({"app": "other-shop"}, "signature"),
    ({"agent": "payouts"}, "signature"),
])
def test_an_altered_link_is_refused(change, message):
    """Changing any signed field (level, approver, expiry, parking, app id, agent) breaks the signature."""
    url = links.link("http://w", SECRET, "r-1", "approve", 1, "manager", 2_000, PARKED, "shop", "refunds")
    fields = {**fields_of(url), **change}
    with pytest.raises(links.LinkError, match=message):
        links.verify(SECRET, "r-1", "approve", fields, now=1_000)


def test_a_link_is_bound_to_its_task_decision_and_secret_and_expires():
    fields = fields_of(links.link("http://w", SECRET, "r-1", "approve", 0, "lead", 2_000, PARKED, "shop", "refunds"))
    with pytest.raises(links.LinkError, match="signature"):
        links.verify(SECRET, "r-2", "approve", fields, now=1_000)
    with pytest.raises(links.LinkError, match="signature"):
        links.verify(SECRET, "r-1", "reject", fields, now=1_000)
    with pytest.raises(links.LinkError, match="signature"):
        links.verify("other", "r-1", "approve", fields, now=1_000)
    with pytest.raises(links.LinkError, match="expired"):
        links.verify(SECRET, "r-1", "approve", fields, now=2_001)
    with pytest.raises(links.LinkError, match="disabled"):
        links.verify("", "r-1", "approve", fields, now=1_000)
    with pytest.raises(links.LinkError, match="incomplete"):
        links.verify(SECRET, "r-1", "approve", {"level": "x"}, now=1_000)
    with pytest.raises(links.LinkError, match="unknown decision"):
        links.verify(SECRET, "r-1", "maybe", fields, now=1_000)


def test_slack_message_has_text_and_link_buttons():
    """Slack-compatible: a plain `text` for any client, and `blocks` with approve/reject URL buttons."""
    urls = {"approve": "http://w/a", "reject": "http://w/r"}
    body = links.slack_message(task_id="r-1", agent="refunds", reason="amount 500 > 100", level=1, level_name="manager",
                               due=0.0, instruction="x" * 400, links=urls)
    assert "level 2, manager" in body["text"] and "http://w/a" in body["text"]
    buttons = body["blocks"][-1]["elements"]
    assert [b["url"] for b in buttons] == ["http://w/a", "http://w/r"]
    assert len(body["blocks"][1]["text"]["text"]) == 300
    plain = links.slack_message(task_id="r-1", agent="refunds", reason="r", level=0, level_name="lead", due=0.0,
                                instruction="", links=None)
    assert all(b["type"] != "actions" for b in plain["blocks"]) and "agents-stream approve" in plain["text"]
