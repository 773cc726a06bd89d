"""A routed agent's run on one executor (execution/handlers.py): fake LLMs over real HTTP, no broker — the route
decided once and journaled first, the handler run on its own part of the journal, escalation up the handlers with
what the weaker one gathered, a replay that never routes again, and the defined fallbacks of a classifier that
gives no usable answer."""

from __future__ import annotations

import json
from typing import Any

from agents_stream.testing.fakellm import FakeLLM, ok, refusal, status
from tests.unit.fake_worker import AGENT, worker

SUPPORT = "agents_stream.examples.support:SUPPORT"


def _desk(**routing: Any) -> dict[str, Any]:
    return {"routing": {"handlers": ["faq", "support"], "classifier": "small",
                        "rules": [{"handler": "faq", "words": ["opening hours"]}], **routing}}


def _handlers(faq: list[str] | None = None) -> dict[str, dict[str, Any]]:
    return {"faq": {"providers": faq or ["p"], "description": "opening hours and shipping"},
            "support": {"providers": ["p"], "description": "complaints, refunds, anything else"}}


def _steps(w: Any, task_id: str) -> list[dict[str, Any]]:
    return [e["output"] for e in w.events(task_id, "step")]


async def test_a_rule_routes_to_the_one_call_handler_and_the_decision_is_journaled_first() -> None:
    async with FakeLLM(default=ok("9 to 5")) as p, FakeLLM(default=ok("support")) as small:
        async with worker({"p": p, "small": small}, _desk(), others=_handlers()) as w:
            task = w.dispatch("t-1", "What are your opening hours?")
            out = await w.outcome(task.task_id)
    assert out["status"] == "succeeded" and out["output"] == "9 to 5" and small.requests == []
    (route,) = _steps(w, "t-1")
    assert route["kind"] == "route" and route["handler"] == "faq" and route["by"] == "rule"
    assert "'opening hours'" in route["reason"] and w.events("t-1", "step")[0]["index"] == 0
    assert out["transcript"]["route"]["first"] == "faq" and out["route"].startswith("faq (rule: rule 1")
    assert len(p.requests) == 1 and p.requests[0].task_id == "t-1"


async def test_the_classifier_routes_when_no_rule_matches_and_its_cost_is_counted() -> None:
    async with FakeLLM(default=ok("We opened a case.")) as p, FakeLLM(
            default=ok("support", input_tokens=30, output_tokens=1)) as small:
        async with worker({"p": p, "small": small}, _desk(), others=_handlers()) as w:
            out = await (w.dispatch("t-2", "Your courier was rude.") and w.outcome("t-2"))
    (route,) = _steps(w, "t-2")
    assert route["handler"] == "support" and route["by"] == "classifier" and route["provider_calls"] == 1
    assert route["usage"]["input_tokens"] == 30 and route["source"] == "classifier:small:small-model"
    asked = small.requests[0].instruction
    assert "- faq: opening hours and shipping" in asked and "Your courier was rude." in asked
    assert out["output"] == "We opened a case." and out["calls"] == 2 and out["usage"]["input_tokens"] >= 30


async def test_a_replay_on_the_journal_never_routes_again() -> None:
    async with FakeLLM(default=ok("fine")) as p, FakeLLM(default=ok("faq")) as small:
        async with worker({"p": p, "small": small}, _desk(), others=_handlers()) as w:
            task = w.dispatch("t-3", "Something else entirely")
            await w.outcome("t-3")
            (route,) = _steps(w, "t-3")
            assert route["handler"] == "faq" and len(small.requests) == 1
            w.outcomes.clear()
            w.executor.dispatch(task, 2, steps_done=[route])  # a crash or takeover after the decision
            again = await w.outcome("t-3")
    assert again["status"] == "succeeded" and len(small.requests) == 1, "a replay asked the classifier again"
    assert _steps(w, "t-3") == [] and again["transcript"]["route"]["first"] == "faq"


async def test_a_refusing_handler_escalates_to_the_stronger_one_with_what_it_gathered() -> None:
    async with FakeLLM(default=ok("Closed on Sundays.")) as p, FakeLLM(default=ok("faq")) as small:
        p.enqueue(refusal())
        async with worker({"p": p, "small": small}, _desk(), others=_handlers()) as w:
            out = await (w.dispatch("t-4", "opening hours on Sunday?") and w.outcome("t-4"))
    route, escalated = _steps(w, "t-4")
    assert escalated["kind"] == "escalated" and (escalated["from"], escalated["to"]) == ("faq", "support")
    assert escalated["reason"] == "it failed" and escalated["provider_calls"] >= 1
    assert [e["index"] for e in w.events("t-4", "step")] == [0, 1]
    assert out["status"] == "succeeded" and out["output"] == "Closed on Sundays."
    assert "Earlier handlers of this message could not answer it" in p.requests[-1].instruction
    assert out["transcript"]["route"]["escalations"] == [{"from": "faq", "to": "support", "reason": "it failed"}]
    assert out["route"].startswith("faq → support")


async def test_an_answer_below_the_routes_confidence_escalates() -> None:
    async with FakeLLM(default=status(503)) as down, FakeLLM(default=ok("maybe")) as p, FakeLLM() as small:
        handlers = _handlers(faq=["down", "p"])  # faq's alternate answers with confidence medium
        async with worker({"down": down, "p": p, "small": small}, _desk(min_confidence="high"),
                          others=handlers) as w:
            out = await (w.dispatch("t-5", "opening hours?") and w.outcome("t-5"))
    _, escalated = _steps(w, "t-5")
    assert escalated["reason"] == "its confidence medium is below the route's high" and escalated["answer"] == "maybe"
    assert out["status"] == "succeeded" and out["transcript"]["route"]["handler"] == "support"


async def test_the_strongest_handlers_failure_is_the_tasks() -> None:
    async with FakeLLM(default=refusal()) as p, FakeLLM(default=ok("support")) as small:
        async with worker({"p": p, "small": small}, _desk(), others=_handlers()) as w:
            out = await (w.dispatch("t-6", "a complaint") and w.outcome("t-6"))
    assert out["kind"] == "failed" and [s["kind"] for s in _steps(w, "t-6")] == ["route"]
    assert out["transcript"]["route"]["first"] == "support"


async def test_an_unreadable_or_missing_classifier_answer_takes_the_fallback() -> None:
    async with FakeLLM(default=ok("fine")) as p, FakeLLM(default=ok("both faq and support")) as small:
        async with worker({"p": p, "small": small}, _desk(fallback="faq"), others=_handlers()) as w:
            await (w.dispatch("t-7", "hm") and w.outcome("t-7"))
    (route,) = _steps(w, "t-7")
    assert route["by"] == "fallback" and route["handler"] == "faq" and "names no handler" in route["reason"]
    async with FakeLLM(default=ok("fine")) as p, FakeLLM(default=status(503)) as small:
        async with worker({"p": p, "small": small}, _desk(), others=_handlers()) as w:
            out = await (w.dispatch("t-8", "hm") and w.outcome("t-8"))
    (route,) = _steps(w, "t-8")
    assert route["by"] == "fallback" and route["handler"] == "support" and "gave no answer" in route["reason"]
    assert out["status"] == "succeeded"


async def test_an_agent_loop_handler_journals_after_the_route_and_an_escalated_one_has_keys_of_its_own() -> None:
    async with FakeLLM(default=ok("Done.")) as p, FakeLLM(default=ok("faq")) as small:
        p.enqueue(refusal())
        handlers = {"faq": {"providers": ["p"]}, "support": {"providers": ["p"], "agent": SUPPORT,
                                                             "approval": {"levels": [{"name": "l", "timeout_s": 60}]}}}
        async with worker({"p": p, "small": small}, _desk(), others=handlers) as w:
            out = await (w.dispatch("t-9", "where is it") and w.outcome("t-9"))
    kinds = [(e["index"], e["output"]["kind"]) for e in w.events("t-9", "step")]
    assert kinds == [(0, "route"), (1, "escalated"), (2, "turn")]
    assert out["status"] == "succeeded" and out["transcript"]["turns"][0]["turn"] == 0
    assert "[task_id=t-9~support]" in json.dumps(p.requests[-1].body)
    assert all(t == "t-9" for t, _ in w.outcomes), "every outcome goes under the task's own id"


async def test_a_plain_agent_is_not_routed() -> None:
    async with FakeLLM(default=ok("hello")) as p:
        async with worker({"p": p}, {"providers": ["p"]}) as w:
            out = await (w.dispatch("t-10", "hi") and w.outcome("t-10"))
    assert out["route"] is None and "transcript" not in out and AGENT == "a"
