"""One rung's calls on one executor: retries with backoff, Retry-After, the breaker, error kinds, timeouts, usage.

Fake LLM servers over HTTP and circuits on an in-memory log; asserted on the outcome, the requests each fake
received and when, the control events and what the circuits log was told.
"""

from __future__ import annotations

import json

from agents_stream.testing.fakellm import FakeLLM, hang, ok, status
from tests.unit.fake_worker import Worker, worker


def kinds(w: Worker) -> list[str]:
    return [json.loads(r.value)["kind"] for r in w.log.records]


async def test_transient_errors_are_retried_with_backoff_on_the_same_provider() -> None:
    """500 and 503 are retried (after a growing delay) until the provider answers: one result, three calls."""
    async with FakeLLM([status(500), status(503), ok("third time")], default=None) as p:
        settings = {"backoff_base_s": 0.1, "backoff_cap_s": 1.0}
        async with worker({"p": p}, {"providers": ["p"]}, settings=settings) as w:
            w.dispatch("t1")
            out = await w.outcome("t1")
    assert (out["status"], out["confidence"], out["output"], out["calls"]) == ("succeeded", "high", "third time", 3)
    assert len(p.requests) == 3 and len({r.instruction for r in p.requests}) == 1
    gaps = [b.ts - a.ts for a, b in zip(p.requests, p.requests[1:], strict=False)]
    assert all(g >= 0.04 for g in gaps), f"backoff between retries: {gaps}"
    assert kinds(w).count("failure") == 2 and w.control_events() == []


async def test_exhausted_retries_on_the_only_provider_hold_the_task() -> None:
    """After max_retries the rung is unavailable; with nothing below it the task is held (no result)."""
    async with FakeLLM([status(502)] * 3, default=None) as p:
        async with worker({"p": p}, {"providers": ["p"]}, settings={"probe_interval_s": 30.0}) as w:
            w.dispatch("t1")
            await w.until(lambda: w.control_events(), what="task.held")
            assert w.events("t1") == [] and len(p.requests) == 3
    assert w.control_events() == [("task.held", "t1")]


async def test_a_429_retry_after_holds_the_only_provider_until_it_expires() -> None:
    """A 429's Retry-After is obeyed: the task is held, and the next call goes out after it, not before."""
    async with FakeLLM([status(429, retry_after=1), ok("now")], default=None) as p:
        async with worker({"p": p}, {"providers": ["p"]}, settings={"probe_interval_s": 5.0}) as w:
            w.dispatch("t1")
            out = await w.outcome("t1")
    assert (out["status"], out["output"], out["source"]) == ("succeeded", "now", "primary:p:p-model")
    assert len(p.requests) == 2 and p.requests[1].ts - p.requests[0].ts >= 0.95
    assert w.control_events() == [("task.held", "t1"), ("task.released", "t1")]
    assert "rate_limited" in kinds(w) and "failure" not in kinds(w)


async def test_a_429_sends_this_and_the_next_tasks_to_the_alternate_while_it_lasts() -> None:
    """While a Retry-After lasts the provider gets no call: tasks go to the alternate at once, unheld."""
    async with FakeLLM([status(429, retry_after=30)], default=None) as p, FakeLLM(default=ok("alt")) as alt:
        async with worker({"p": p, "alt": alt}, {"providers": ["p", "alt"]}) as w:
            w.dispatch("t1")
            first = await w.outcome("t1")
            w.dispatch("t2")
            second = await w.outcome("t2")
    assert first["source"] == second["source"] == "alternate:alt:alt-model"
    assert first["confidence"] == second["confidence"] == "medium"
    assert len(p.requests) == 1 and len(alt.requests) == 2 and w.control_events() == []


async def test_an_open_breaker_admits_no_call_and_the_alternate_answers() -> None:
    """The failure that opens the breaker is the primary's last call: later tasks skip it entirely."""
    async with FakeLLM([status(503)], default=None) as p, FakeLLM(default=ok("alt")) as alt:
        async with worker({"p": p, "alt": alt}, {"providers": ["p", "alt"]}, breaker={"failure_threshold": 1}) as w:
            w.dispatch("t1")
            first = await w.outcome("t1")
            assert not w.circuits.available("p")[0]
            w.dispatch("t2")
            second = await w.outcome("t2")
    assert first["source"] == second["source"] == "alternate:alt:alt-model"
    assert len(p.requests) == 1 and len(alt.requests) == 2
    assert first["calls"] == 2 and second["calls"] == 1


async def test_a_rejected_request_fails_the_task_without_retrying_or_falling_back() -> None:
    """A 400 is the task's fault: one call, a failed outcome naming the rung, no alternate."""
    async with FakeLLM([status(400)], default=None) as p, FakeLLM(default=None) as alt:
        async with worker({"p": p, "alt": alt}, {"providers": ["p", "alt"]}) as w:
            w.dispatch("t1")
            out = await w.outcome("t1")
    assert out["kind"] == "failed" and out["reason"].startswith("permanent_error: ") and out["source"] == "primary:p"
    assert len(p.requests) == 1 and alt.requests == []
    assert "failure" not in kinds(w), "the provider answered: it is not failing"


async def test_a_systemic_error_falls_back_and_alerts_once_per_provider() -> None:
    """A 401 means the provider cannot be used at all: no retry, the alternate answers, one alert for two tasks."""
    async with FakeLLM([status(401), status(401)], default=None) as p, FakeLLM(default=ok("alt")) as alt:
        async with worker({"p": p, "alt": alt}, {"providers": ["p", "alt"]}) as w:
            w.dispatch("t1")
            await w.outcome("t1")
            w.dispatch("t2")
            out = await w.outcome("t2")
    assert out["source"] == "alternate:alt:alt-model" and len(p.requests) == 2
    alerts = [c for c in w.controls if c.event == "alert.provider_systemic"]
    assert [(c.subject, c.agent) for c in alerts] == [("p", "a")] and "401" in alerts[0].details["error"]


async def test_a_call_that_outlives_its_timeout_is_retried() -> None:
    """A provider that does not answer within timeout_s counts as a transient failure and is called again."""
    async with FakeLLM([hang(3.0), ok("in time")], default=None) as p:
        async with worker({"p": p}, {"providers": ["p"]}, providers={"p": {"timeout_s": 0.3}}) as w:
            w.dispatch("t1")
            out = await w.outcome("t1")
    assert (out["output"], out["calls"]) == ("in time", 2) and len(p.requests) == 2
    assert p.requests[1].ts - p.requests[0].ts >= 0.25


async def test_usage_and_cost_add_up_over_every_call_of_the_task() -> None:
    """Tokens of every call (a failed format attempt too) and their price land in the outcome's usage."""
    schema = {"type": "object"}
    replies = [ok("not json", input_tokens=1000, output_tokens=10), ok("{}", input_tokens=1200, output_tokens=20)]
    async with FakeLLM(replies, default=None) as p:
        prices = {"p-model": {"input_per_mtok": 1.0, "output_per_mtok": 10.0}}
        async with worker({"p": p}, {"providers": ["p"], "output_schema": schema}, prices=prices) as w:
            w.dispatch("t1")
            out = await w.outcome("t1")
    assert out["usage"] == {"input_tokens": 2200, "output_tokens": 30, "cost": 0.0025}


async def test_an_unpriced_model_reports_an_unknown_cost() -> None:
    """A model with no configured price costs None (unknown), not 0."""
    async with FakeLLM([ok("x", input_tokens=5, output_tokens=7)], default=None) as p:
        async with worker({"p": p}, {"providers": ["p"]}) as w:
            w.dispatch("t1")
            out = await w.outcome("t1")
    assert out["usage"] == {"input_tokens": 5, "output_tokens": 7, "cost": None}


async def test_an_answer_over_the_answer_limit_fails_the_task_as_result_too_large() -> None:
    """An answer larger than AGENTS_STREAM_ANSWER_MAX_BYTES would grow the task's record past what Kafka takes:
    one call, a failed outcome with reason result_too_large, no retry and no alternate."""
    async with FakeLLM([ok("x" * 5000)], default=None) as p, FakeLLM(default=None) as alt:
        async with worker({"p": p, "alt": alt}, {"providers": ["p", "alt"]}, settings={"answer_max_bytes": 4000}) as w:
            w.dispatch("t1")
            out = await w.outcome("t1")
    assert out["kind"] == "failed" and out["reason"].startswith("result_too_large: ")
    assert out["error"].startswith("result_too_large: ") and out["source"] == "primary:p"
    assert len(p.requests) == 1 and alt.requests == []


async def test_steps_whose_answers_outgrow_the_record_end_the_task_before_the_next_step() -> None:
    """Five steps of 300 KB answers: the checkpoint passes AGENTS_STREAM_RECORD_MAX_BYTES (1 MB) at the fourth,
    so the task fails there with result_too_large; the fifth step is never called."""
    async with FakeLLM(default=ok("y" * 300_000)) as p:
        async with worker({"p": p}, {"providers": ["p"]}, settings={"answer_max_bytes": 400_000}) as w:
            w.dispatch("t1", steps=["one", "two", "three", "four", "five"])
            out = await w.outcome("t1", timeout=30)
    assert out["kind"] == "failed" and out["reason"].startswith("result_too_large: ")
    assert len(p.requests) == 4 and len(w.events("t1", "step")) == 3, "three steps checkpointed, none after"
