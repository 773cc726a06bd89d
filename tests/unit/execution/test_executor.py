"""The executor as a service: dispatch, graceful stop, heartbeats, multi-step tasks and sagas, without a broker."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agents_stream.contract.models import TaskPayload
from agents_stream.execution.saga_definitions import SagaDefinition, SagaStep, StepContext
from agents_stream.testing.fakellm import FakeLLM, ok
from tests.unit.fake_worker import AGENT, worker

#: what the saga's fake services were asked, as (operation, step, idempotency key)
SERVICE_CALLS: list[tuple[str, str, str]] = []
FAIL_PAY: list[bool] = [False]


async def _book(ctx: StepContext) -> Any:
    SERVICE_CALLS.append(("book", ctx.step, ctx.key))
    return {"booking": "B1"}


async def _cancel(ctx: StepContext) -> Any:
    SERVICE_CALLS.append(("cancel", ctx.step, ctx.key))


async def _pay(ctx: StepContext) -> Any:
    SERVICE_CALLS.append(("pay", ctx.step, ctx.key))
    if FAIL_PAY[0]:
        raise RuntimeError("card declined")
    return {"paid": ctx.outputs["book"]["booking"]}


TRIP = SagaDefinition("trip", (SagaStep("book", _book, _cancel), SagaStep("pay", _pay, pivot=True)), timeout_s=2.0)
SAGA_AGENT = {"providers": ["p"], "saga": f"{__name__}:TRIP"}


async def test_stop_lets_a_running_call_finish_within_the_grace_period() -> None:
    """stop() takes nothing new and waits for the call in flight: its outcome is sent before stop returns."""
    async with FakeLLM([ok("done", latency=0.5)], default=None) as p:
        async with worker({"p": p}, {"providers": ["p"]}, settings={"shutdown_grace_s": 5.0}) as w:
            w.dispatch("t1")
            await w.until(lambda: p.requests, what="the call started")
            started = time.monotonic()
            await w.executor.stop()
            assert time.monotonic() - started < 3.0
            assert [o["output"] for o in w.events("t1", "succeeded")] == ["done"]
            w.dispatch("t2")
            await asyncio.sleep(0.1)
            assert w.events("t2") == [] and len(p.requests) == 1, "a stopped executor takes nothing new"


async def test_stop_cancels_calls_that_outlive_the_grace_period() -> None:
    """A call still running when the grace period ends is cancelled: no outcome (its lease will lapse)."""
    async with FakeLLM([ok("late", latency=5.0)], default=None) as p:
        async with worker({"p": p}, {"providers": ["p"]}, settings={"shutdown_grace_s": 0.2}) as w:
            w.dispatch("t1")
            await w.until(lambda: p.requests, what="the call started")
            started = time.monotonic()
            await w.executor.stop()
            assert time.monotonic() - started < 3.0
    assert w.events("t1") == [] and not w.executor.has("t1")


async def test_running_tasks_renew_their_lease_with_heartbeats() -> None:
    """While a task is here, heartbeats name its dispatch and this worker, about every lease_ttl / 3."""
    async with FakeLLM([ok("slow", latency=1.0)], default=None) as p:
        async with worker({"p": p}, {"providers": ["p"]}, settings={"lease_ttl_s": 0.6}) as w:
            w.dispatch("t1", dispatch=2)
            await w.outcome("t1")
    beats = w.events("t1", "heartbeat")
    beat = {"schema_version": 1, "kind": "heartbeat", "worker": "w1", "dispatch": 2, "owner": "w1"}
    assert len(beats) >= 3 and all(b == beat for b in beats)


async def test_a_task_dispatched_twice_runs_once() -> None:
    """A second dispatch of a task already here (queued or running) is ignored: one call, one outcome."""
    async with FakeLLM([ok("once", latency=0.2)], default=None) as p:
        async with worker({"p": p}, {"providers": ["p"]}) as w:
            w.dispatch("t1")
            w.dispatch("t1", dispatch=2)
            out = await w.outcome("t1")
            await asyncio.sleep(0.1)
    assert out["dispatch"] == 1 and len(p.requests) == 1 and len(w.events("t1", "succeeded")) == 1


async def test_a_multi_step_task_checkpoints_each_step_and_passes_it_on() -> None:
    """Each step is its own call with the outputs so far as context; each is sent as a step event first."""
    async with FakeLLM([ok("one"), ok("two")], default=None) as p:
        async with worker({"p": p}, {"providers": ["p"]}) as w:
            w.dispatch("t1", instruction="Plan a trip.", steps=["pick a city", {"instruction": "book a hotel"}])
            out = await w.outcome("t1")
    assert [(e["index"], e["output"]) for e in w.events("t1", "step")] == [(0, "one"), (1, "two")]
    assert (out["status"], out["output"], out["confidence"], out["source"]) == (
        "succeeded", ["one", "two"], "high", "primary:p:p-model")
    first, second = p.requests
    assert "Step 1 of 2: pick a city" in first.instruction and "Step 2 of 2: book a hotel" in second.instruction
    assert "previous_steps" not in first.body["messages"][-1]["content"]
    assert (
        '"previous_steps"' in second.body["messages"][-1]["content"] and "one" in second.body["messages"][-1]["content"]
    )


async def test_a_redispatched_multi_step_task_does_only_the_steps_not_done() -> None:
    """Steps from the checkpoint are not called again; the result holds them and the new ones."""
    async with FakeLLM([ok("two")], default=None) as p:
        async with worker({"p": p}, {"providers": ["p"]}) as w:
            task = TaskPayload(task_id="t1", agent_name=AGENT, instruction="Plan a trip.", steps=["a", "b"])
            w.executor.dispatch(task, 2, ["one"])
            out = await w.outcome("t1")
    assert out["output"] == ["one", "two"] and [e["index"] for e in w.events("t1", "step")] == [1]
    assert len(p.requests) == 1 and "Step 2 of 2: b" in p.requests[0].instruction


async def test_a_saga_runs_its_steps_with_idempotency_keys_and_completes() -> None:
    """A saga agent runs its actions in order, each report checkpointed; no provider is called."""
    SERVICE_CALLS.clear()
    FAIL_PAY[0] = False
    async with FakeLLM(default=None) as p:
        async with worker({"p": p}, SAGA_AGENT) as w:
            w.dispatch("t1")
            out = await w.outcome("t1")
    assert (out["status"], out["source"], out["output"]) == (
        "succeeded", "saga:trip", {"book": {"booking": "B1"}, "pay": {"paid": "B1"}})
    assert SERVICE_CALLS == [("book", "book", "t1:book"), ("pay", "pay", "t1:pay")] and p.requests == []
    assert [e["output"]["event"] for e in w.events("t1", "step")] == ["action_succeeded", "action_succeeded"]
    assert ("saga.completed", "t1") in w.control_events("saga.")


async def test_a_saga_failing_before_its_pivot_is_compensated_and_fails() -> None:
    """A failed pivot undoes the steps before it (their compensations) and the task fails, dead-lettered."""
    SERVICE_CALLS.clear()
    FAIL_PAY[0] = True
    try:
        async with FakeLLM(default=None) as p:
            async with worker({"p": p}, SAGA_AGENT) as w:
                w.dispatch("t1")
                out = await w.outcome("t1")
    finally:
        FAIL_PAY[0] = False
    assert out["kind"] == "failed" and out["reason"].startswith("saga_compensated: ")
    assert out["source"] == "saga:trip" and "undone: ['book']" in out["error"]
    assert SERVICE_CALLS[0] == ("book", "book", "t1:book") and SERVICE_CALLS[-1][0] == "cancel"
    events = [e for e, _ in w.control_events("saga.")]
    assert "saga.compensating" in events and "saga.compensated" in events


async def test_a_saga_resumed_from_its_checkpoint_does_not_repeat_done_actions() -> None:
    """Reports from the checkpoint are replayed, not re-run, and their control events are not sent again."""
    SERVICE_CALLS.clear()
    FAIL_PAY[0] = False
    async with FakeLLM(default=None) as p:
        async with worker({"p": p}, SAGA_AGENT) as w:
            done = [{"event": "action_succeeded", "step": "book", "output": {"booking": "B7"}}]
            w.executor.dispatch(TaskPayload(task_id="t1", agent_name=AGENT, instruction="Go."), 2, done)
            out = await w.outcome("t1")
    assert SERVICE_CALLS == [("pay", "pay", "t1:pay")] and out["output"]["pay"] == {"paid": "B7"}
    assert [e["index"] for e in w.events("t1", "step")] == [1] and out["dispatch"] == 2
    assert ("saga.completed", "t1") in w.control_events("saga.")


async def test_a_full_queue_pauses_intake_and_a_free_slot_resumes_it() -> None:
    """When max_queued tasks wait for a slot the agent is blocked (flow changes); taking one frees it again."""
    async with FakeLLM([ok("1", latency=0.3), ok("2")], default=None) as p:
        settings = {"max_in_flight": 1, "max_queued": 1}
        async with worker({"p": p}, {"providers": ["p"]}, settings=settings) as w:
            w.dispatch("t1")  # fills the queue (a change), then a slot takes it (a change)
            await w.until(lambda: p.requests, what="the first call started")
            assert not w.executor.blocked(AGENT) and w.flow_changes == 2
            w.dispatch("t2")
            assert w.executor.blocked(AGENT) and w.flow_changes == 3
            await w.outcome("t2")
            assert not w.executor.blocked(AGENT) and w.flow_changes == 4


async def test_an_agent_loops_final_answer_goes_just_ahead_of_its_outcome_which_does_not_wait_for_it() -> None:
    """The final answer's journal entry and the task's outcome are sent in order, the outcome without waiting for
    the entry's confirmation: applied here, the ledger writes both to the task's record at once (one write)."""
    async with FakeLLM(default=ok("Your parcel is on its way.")) as p:
        support = {"providers": ["p"], "agent": "agents_stream.examples.support:SUPPORT",
                   "approval": {"levels": [{"name": "l", "timeout_s": 60}]}}
        async with worker({"p": p}, support) as w:
            w.confirm_journal = asyncio.Event()
            w.dispatch("t-final", "Where is order o-1?")
            # the old order (the entry confirmed, then the outcome) never gets here while the entry is unconfirmed
            out = await w.outcome("t-final")
            sent = [e["kind"] for e in w.events("t-final")]
            w.confirm_journal.set()
    assert out["kind"] == "succeeded" and out["output"] == "Your parcel is on its way."
    assert sent[-2:] == ["step", "succeeded"], f"the final entry just ahead of the outcome: {sent}"
    final = w.events("t-final", "step")[-1]
    assert final["output"]["kind"] == "turn" and final["output"]["text"] == "Your parcel is on its way."
