"""A routed run's journal read back (tables/route_journal.py) and its events (tables/conversation_events.py), pure."""

from __future__ import annotations

import json

import pytest
from agents_stream.tables import route_journal as routes
from agents_stream.tables.conversation_events import round_events
from agents_stream.tables.leases import TaskRecord

ROUTE = {"kind": "route", "turn": -1, "handler": "faq", "by": "classifier", "reason": "the classifier answered 'faq'",
         "source": "classifier:small:m", "provider_calls": 1,
         "usage": {"input_tokens": 30, "output_tokens": 1, "cost": 0.001}}
ESCALATED = {"kind": "escalated", "turn": -1, "from": "faq", "to": "support", "reason": "it failed",
             "answer": "I cannot", "tools": [], "provider_calls": 2,
             "usage": {"input_tokens": 100, "output_tokens": 5, "cost": 0.002}}
SUMMARY = {"kind": "summary", "turn": -1, "text": "earlier", "until": 4, "error": None}
TURN = {"kind": "turn", "turn": 0, "text": "", "calls": [{"id": "c1", "name": "lookup_order", "arguments": {}}]}
TOOL = {"kind": "tool", "turn": 0, "id": "c1", "name": "lookup_order", "content": "x" * 900, "error": False}


def test_an_unrouted_journal_has_no_decision() -> None:
    state = routes.read([SUMMARY, TURN])
    assert state.decision is None and state.handler is None and state.base == 0
    assert routes.route_transcript([TURN]) is None and routes.usage_of([TURN]) == (0, 0, 0, None)


def test_the_route_and_its_escalations_name_the_handler_and_where_its_part_begins() -> None:
    state = routes.read([SUMMARY, ROUTE, TURN, TOOL])
    assert state.handler == "faq" and state.base == 2
    state = routes.read([SUMMARY, ROUTE, TURN, TOOL, ESCALATED, TURN])
    assert state.handler == "support" and state.base == 5 and len(state.escalations) == 1


def test_a_second_route_and_an_escalation_from_another_handler_are_ignored() -> None:
    other = {**ROUTE, "handler": "support"}
    stray = {**ESCALATED, "from": "support", "to": "x"}
    state = routes.read([ROUTE, other, stray])
    assert state.handler == "faq" and state.escalations == [] and state.base == 1


def test_a_handler_runs_on_its_part_of_the_journal_with_the_rounds_summary_ahead() -> None:
    journal = [SUMMARY, ROUTE, TURN, TOOL, ESCALATED, TURN]
    state = routes.read(journal)
    assert routes.handler_part(journal, state, keep_summary=True) == ([SUMMARY, TURN], 1)
    assert routes.handler_part(journal, state, keep_summary=False) == ([TURN], 0)  # a saga reads no summary


@pytest.mark.parametrize(("status", "confidence", "minimum", "why"), [
    ("succeeded", "high", "high", None),
    ("succeeded", "medium", "low", None),
    ("succeeded", "low", "medium", "its confidence low is below the route's medium"),
    ("partial", "failed", "low", "its answer is partial"),
    ("failed", "failed", "low", "it failed"),
])
def test_what_escalates(status: str, confidence: str, minimum: str, why: str | None) -> None:
    assert routes.below(status, confidence, minimum) == why


def test_the_route_costs_the_classifier_and_the_handlers_that_escalated() -> None:
    calls, tokens_in, tokens_out, cost = routes.usage_of([ROUTE, TURN, ESCALATED])
    assert (calls, tokens_in, tokens_out) == (3, 130, 6) and cost == pytest.approx(0.003)


def test_what_the_stronger_handler_is_told_and_the_transcript_says() -> None:
    tools = routes.tools_of([TURN, TOOL])
    assert tools == [{"name": "lookup_order", "error": False, "content": "x" * 499 + "…"}]
    told = routes.gathered_text([{**ESCALATED, "tools": tools}])
    assert "- faq: it failed" in told and "its answer: I cannot" in told and "its tool lookup_order:" in told
    assert routes.gathered_text([]) == ""
    said = routes.route_transcript([ROUTE, ESCALATED])
    assert said == {"handler": "support", "first": "faq", "by": "classifier", "reason": ROUTE["reason"],
                    "source": "classifier:small:m", "usage": ROUTE["usage"],
                    "escalations": [{"from": "faq", "to": "support", "reason": "it failed"}]}


def _record(entries: list[object]) -> TaskRecord:
    return TaskRecord(state="running", agent="desk", dispatch=1, owner="w1", lease_until=0.0, payload="{}",
                      topic="agent.tasks.desk", partition=0, offset=0, received_at=0.0,
                      steps_done=json.dumps(entries))


def test_a_routed_round_shows_its_decision_its_escalation_and_each_handlers_turns_apart() -> None:
    events = round_events(2, None, _record([ROUTE, TURN, ESCALATED, TURN]))
    ids = [(e["id"], e["kind"]) for e in events]
    assert ids == [("round:2:dispatch:1", "dispatched"), ("round:2:route", "routed"), ("round:2:turn:0", "turn"),
                   ("round:2:escalated:support", "escalated"), ("round:2:turn:0:h1", "turn")]
    routed = events[1]["data"]
    assert routed["handler"] == "faq" and routed["by"] == "classifier" and routed["tokens"] == 31
    later = round_events(2, _record([ROUTE, TURN, ESCALATED]), _record([ROUTE, TURN, ESCALATED, TURN]))
    assert [e["id"] for e in later] == ["round:2:turn:0:h1"]
