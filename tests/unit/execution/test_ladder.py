"""The fallback ladder end to end on one executor: fake LLM servers over HTTP, circuits on an in-memory log.

Each rung, the format retry, the router's escalation, the budget and holds, asserted on what a user sees:
the outcome (status, confidence, source), the requests each fake received, and the control events.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from agents_stream.contract.events import CachedAnswer
from agents_stream.execution.outputs import SIMPLIFY_PREFIX, fingerprint
from agents_stream.testing.fakellm import FakeLLM, ok, status
from tests.unit.fake_worker import AGENT, worker

DOWN = [status(503)] * 3  # one call and FAST's two retries
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
REJECTED = "Your previous answer was rejected:"


def seen(*fakes: FakeLLM) -> list[int]:
    return [len(f.requests) for f in fakes]


async def test_the_primary_answers_with_confidence_high() -> None:
    """A healthy primary answers the task as given; nothing else is called."""
    async with FakeLLM([ok("the summary")], default=None) as p, FakeLLM(default=None) as alt:
        async with worker({"p": p, "alt": alt}, {"providers": ["p", "alt"]}) as w:
            w.dispatch("t1")
            out = await w.outcome("t1")
    assert (out["status"], out["confidence"], out["source"], out["output"]) == (
        "succeeded", "high", "primary:p:p-model", "the summary")
    assert seen(p, alt) == [1, 0]
    assert p.requests[0].instruction.startswith("[task_id=t1]\nSummarise the report.")
    assert out["calls"] == 1 and out["route"] is None and w.control_events() == []


async def test_a_failing_primary_falls_back_to_the_alternate_with_confidence_medium() -> None:
    """The primary's transient errors are retried, then the alternate answers the same prompt with medium."""
    async with FakeLLM(DOWN, default=None) as p, FakeLLM([ok("from alt")], default=None) as alt:
        async with worker({"p": p, "alt": alt}, {"providers": ["p", "alt"]}) as w:
            w.dispatch("t1")
            out = await w.outcome("t1")
    assert (out["status"], out["confidence"], out["source"], out["output"]) == (
        "succeeded", "medium", "alternate:alt:alt-model", "from alt")
    assert seen(p, alt) == [3, 1]
    assert alt.requests[0].instruction == p.requests[0].instruction
    assert out["calls"] == 4 and w.control_events() == []


async def test_below_the_alternates_the_light_model_answers_a_simplified_task_with_low() -> None:
    """lowest = "low": with every full tier down, the light model gets the simplified task and fewer tokens."""
    async with FakeLLM(DOWN, default=None) as p, FakeLLM([ok("brief")], default=None) as mini:
        async with worker({"p": p, "mini": mini}, {"providers": ["p"], "light": "mini", "lowest": "low"}) as w:
            w.dispatch("t1", context_data={"doc": "x" * 900})
            out = await w.outcome("t1")
    assert (out["status"], out["confidence"], out["source"]) == ("succeeded", "low", "light:mini:mini-model")
    assert seen(p, mini) == [3, 1]
    assert SIMPLIFY_PREFIX in mini.requests[0].instruction and SIMPLIFY_PREFIX not in p.requests[0].instruction
    assert mini.requests[0].body["max_tokens"] == 256 and p.requests[0].body["max_tokens"] == 1024


async def test_below_every_provider_the_cached_answer_of_the_same_fingerprint_answers_with_low() -> None:
    """With cache_max_age_s and lowest = "low", a young cached answer of the same fingerprint is the answer."""
    async with FakeLLM(DOWN, default=None) as p:
        async with worker({"p": p}, {"providers": ["p"], "lowest": "low", "cache_max_age_s": 60}) as w:
            task = w.dispatch("t1", dispatch=3)
            await w.until(lambda: w.lookups, what="a cache lookup")
            at = time.time() - 5
            w.executor.cache_answer("t1", CachedAnswer(
                task_id="t0", output="yesterday's", source="primary:p:p-model", confidence="high", at=at))
            out = await w.outcome("t1")
    assert w.lookups == [("t1", fingerprint(AGENT, task.instruction, {}, None), 3)]
    assert (out["status"], out["confidence"], out["source"], out["output"]) == (
        "succeeded", "low", "cache:t0", "yesterday's")
    assert out["cached_at"] == at and seen(p) == [3]


async def test_a_cached_answer_older_than_the_limit_is_not_used_and_the_task_holds() -> None:
    """A cached answer past cache_max_age_s is no answer: with nothing else allowed, the task is held."""
    async with FakeLLM(DOWN, default=None) as p:
        settings = {"probe_interval_s": 30.0}
        async with worker({"p": p}, {"providers": ["p"], "lowest": "low", "cache_max_age_s": 60},
                          settings=settings) as w:
            w.dispatch("t1")
            await w.until(lambda: w.lookups, what="a cache lookup")
            w.executor.cache_answer("t1", CachedAnswer(
                task_id="t0", output="stale", source="primary:p:p-model", confidence="high", at=time.time() - 120))
            await w.until(lambda: w.control_events(), what="task.held")
            assert w.events("t1") == [] and w.executor.held == 1
    assert w.control_events() == [("task.held", "t1")]
    assert w.controls[0].details == {"reason": "no provider of its ladder is available"}


async def test_lowest_failed_ends_with_the_explicit_partial_result() -> None:
    """lowest = "failed": with every provider down the task ends partial, confidence failed, no output."""
    async with FakeLLM(DOWN, default=None) as p:
        async with worker({"p": p}, {"providers": ["p"], "lowest": "failed"}) as w:
            w.dispatch("t1")
            out = await w.outcome("t1")
    assert out["kind"] == "succeeded" and out["partial"] is True and out["output"] is None
    assert (out["status"], out["confidence"], out["source"]) == ("partial", "failed", "none")
    assert out["error"] == "every provider of the agent was unavailable" and seen(p) == [3]


async def test_an_off_format_answer_is_retried_with_the_corrective_instruction() -> None:
    """An answer that fails the output schema is asked again, saying why; the second answer is the result."""
    async with FakeLLM([ok("Sure! n is one."), ok('{"n": 1}')], default=None) as p:
        async with worker({"p": p}, {"providers": ["p"], "output_schema": SCHEMA}) as w:
            w.dispatch("t1")
            out = await w.outcome("t1")
    assert (out["status"], out["confidence"], out["output"]) == ("succeeded", "high", {"n": 1})
    first, second = (r.instruction for r in p.requests)
    assert "JSON Schema" in first and REJECTED not in first
    assert second.startswith(first.split("\n\nAnswer with only JSON")[0]) and REJECTED in second
    assert out["calls"] == 2


async def test_an_answer_that_never_matches_the_schema_fails_the_task_without_falling_back() -> None:
    """After format_retries corrective retries the task fails (the answer is wrong, not the provider down)."""
    async with FakeLLM([ok("no"), ok("still no")], default=None) as p, FakeLLM(default=None) as alt:
        agent = {"providers": ["p", "alt"], "output_schema": SCHEMA, "format_retries": 1}
        async with worker({"p": p, "alt": alt}, agent) as w:
            w.dispatch("t1")
            out = await w.outcome("t1")
    assert out["kind"] == "failed" and out["reason"].startswith("invalid_output: ")
    assert out["source"] == "primary:p" and "never matched the output schema" in out["error"]
    assert seen(p, alt) == [2, 0]


ROUTED = {"providers": ["p"], "light": "mini", "router": "heuristic", "output_schema": {"type": "object"}}


async def test_an_easy_task_goes_to_the_light_model_first_with_high() -> None:
    """The router sends an easy task to the light model first (the whole task); its answer counts as high."""
    async with FakeLLM(default=None) as p, FakeLLM([ok('{"answer": 1}')], default=None) as mini:
        async with worker({"p": p, "mini": mini}, ROUTED) as w:
            w.dispatch("t1", instruction="Say hi.")
            out = await w.outcome("t1")
    assert (out["confidence"], out["source"], out["output"]) == ("high", "light:mini:mini-model", {"answer": 1})
    assert out["route"].startswith("easy: ") and seen(p, mini) == [0, 1]
    assert SIMPLIFY_PREFIX not in mini.requests[0].instruction


async def test_a_hard_task_skips_the_light_model() -> None:
    """A task the heuristic finds hard starts at the primary."""
    async with FakeLLM([ok('{"answer": 2}')], default=None) as p, FakeLLM(default=None) as mini:
        async with worker({"p": p, "mini": mini}, ROUTED) as w:
            w.dispatch("t1", instruction="Analyze and compare both designs step by step, then explain why.")
            out = await w.outcome("t1")
    assert (out["confidence"], out["source"]) == ("high", "primary:p:p-model")
    assert out["route"].startswith("hard: ") and seen(p, mini) == [1, 0]


@pytest.mark.parametrize("light_says", [
    pytest.param([ok('{"answer": 1, "confidence": "low"}')], id="low-confidence"),
    pytest.param([ok("prose, not JSON")], id="failed-format"),
])
async def test_the_routed_light_tier_escalates_to_the_primary(light_says: list) -> None:
    """An easy task's light answer that says it is unsure, or fails the format, moves up to the primary."""
    async with FakeLLM([ok('{"answer": 2}')], default=None) as p, FakeLLM(light_says, default=None) as mini:
        async with worker({"p": p, "mini": mini}, {**ROUTED, "format_retries": 0}) as w:
            w.dispatch("t1", instruction="Say hi.")
            out = await w.outcome("t1")
    assert (out["confidence"], out["source"], out["output"]) == ("high", "primary:p:p-model", {"answer": 2})
    assert out["route"].startswith("easy: ") and out["route"].endswith("; escalated from mini")
    assert seen(p, mini) == [1, 1] and out["calls"] == 2


async def test_an_escalated_answer_is_used_when_nothing_above_it_answers() -> None:
    """The light model's own low answer stands when the primary is down and lowest allows low; it is not
    asked again with the simplified task."""
    async with FakeLLM(DOWN, default=None) as p, FakeLLM([ok('{"confidence": "low"}')], default=None) as mini:
        async with worker({"p": p, "mini": mini}, {**ROUTED, "lowest": "low"}) as w:
            w.dispatch("t1", instruction="Say hi.")
            out = await w.outcome("t1")
    assert (out["status"], out["confidence"], out["source"]) == ("succeeded", "low", "light:mini:mini-model")
    assert seen(p, mini) == [3, 1]


BUDGET = {"providers": ["p"], "light": "mini", "budget_usd_per_day": 1.0}


async def test_over_budget_cheaper_sends_the_task_to_the_light_model_only() -> None:
    """Past today's budget (cluster-wide spend from the circuits log) with over_budget = "cheaper", the light
    model answers the whole task with medium and the primary is not called."""
    async with FakeLLM(default=None) as p, FakeLLM([ok("cheap")], default=None) as mini:
        async with worker({"p": p, "mini": mini}, {**BUDGET, "over_budget": "cheaper"}, spent_usd=2.5) as w:
            assert not w.executor.blocked(AGENT)
            w.dispatch("t1")
            out = await w.outcome("t1")
    assert (out["status"], out["confidence"], out["source"]) == ("succeeded", "medium", "light:mini:mini-model")
    assert out["route"] == "over budget (2.5000 >= 1 USD today): light tier only"
    assert seen(p, mini) == [0, 1] and SIMPLIFY_PREFIX not in mini.requests[0].instruction


@pytest.mark.parametrize("agent", [
    pytest.param({**BUDGET, "over_budget": "hold"}, id="hold"),
    pytest.param({**BUDGET, "over_budget": "cheaper", "lowest": "high"}, id="cheaper-but-medium-not-allowed"),
    pytest.param({"providers": ["p"], "budget_usd_per_day": 1.0}, id="cheaper-without-a-light-model"),
])
async def test_over_budget_hold_holds_tasks_until_the_day_turns(agent: dict) -> None:
    """Past the budget with nothing cheaper allowed, intake is blocked and a task is held without a call."""
    async with FakeLLM(default=None) as p, FakeLLM(default=None) as mini:
        async with worker({"p": p, "mini": mini}, agent, spent_usd=2.5) as w:
            assert w.executor.blocked(AGENT)
            w.dispatch("t1")
            await w.until(lambda: w.control_events(), what="task.held")
            await asyncio.sleep(0.2)
            assert w.events("t1") == [] and w.executor.held == 1
    assert seen(p, mini) == [0, 0]
    assert w.control_events() == [("task.held", "t1")]
    assert w.controls[0].details == {"reason": "over budget (2.5000 >= 1 USD today): held until the UTC day turns"}


async def test_a_task_held_by_an_open_breaker_is_released_when_a_probe_succeeds() -> None:
    """The primary's failure opens its breaker (folded from the circuits log): the task is held, pauses intake,
    and is released by the half-open probe's answer (its own call, or the breaker's one-token probe that may come
    first): task.held then task.released, one result."""
    async with FakeLLM([status(503)], default=ok("back")) as p:
        breaker = {"failure_threshold": 1, "open_timeout_s": 0.5, "success_threshold": 1}
        async with worker({"p": p}, {"providers": ["p"]}, breaker=breaker, settings={"probe_interval_s": 5.0}) as w:
            w.dispatch("t1")
            await w.until(lambda: w.control_events(), what="task.held")
            assert w.executor.held == 1 and w.flow_changes >= 1
            assert w.executor.blocked(AGENT), "an agent whose every provider is open takes no new tasks"
            out = await w.outcome("t1")
            assert w.executor.held == 0
    assert (out["status"], out["confidence"], out["source"], out["output"]) == (
        "succeeded", "high", "primary:p:p-model", "back")
    assert w.control_events() == [("task.held", "t1"), ("task.released", "t1")]
    assert w.controls[0].details == {"reason": "no provider of its ladder is available"}
    task_calls = [r for r in p.requests if r.task_id == "t1"]
    assert len(task_calls) == 2 and task_calls[1].ts - task_calls[0].ts >= 0.45
    assert len(p.requests) - len(task_calls) <= 1, "at most one probe of the breaker's own"
    assert all(r.instruction == "ping" for r in p.requests if r.task_id is None)
    kinds = [json.loads(r.value)["kind"] for r in w.log.records]
    assert kinds.count("failure") == 1 and "probe" in kinds and "success" in kinds
