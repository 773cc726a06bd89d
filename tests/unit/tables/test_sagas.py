"""The saga state machine (tables/sagas.py), driven through the support refund example with scripted failures."""

from __future__ import annotations

import pytest
from agents_stream.tables import sagas
from agents_stream.tables.sagas import (
    COMPENSATED,
    COMPLETED,
    ActionFailed,
    ActionSucceeded,
    CompensationFailed,
    CompensationSucceeded,
    Control,
    RunAction,
    Saga,
)
from hypothesis import given, settings
from hypothesis import strategies as st

REFUND = Saga("refund", ("label", "refund", "notify", "update_order"), pivot="refund")


def run(saga: Saga, failures: dict[tuple[str, str], int],
        limit: int = 200) -> tuple[sagas.SagaState, list[tuple[str, str, str]], list[Control]]:
    """Drive a saga to its end; ``failures[(kind, step)]`` = how many attempts of it fail first.

    Returns the final state, the calls the services saw as (kind, step, idempotency key), and the control events.
    """
    left = dict(failures)
    state, effects = sagas.start(saga, "s-1")
    calls, controls = [], []
    for _ in range(limit):
        if state.terminal:
            break
        work = [e for e in effects if not isinstance(e, Control)]
        controls += [e for e in effects if isinstance(e, Control)]
        assert len(work) == 1, f"exactly one thing is due at a time: {effects}"
        effect = work[0]
        kind = "action" if isinstance(effect, RunAction) else "compensation"
        calls.append((kind, effect.step, effect.key))
        failing = left.get((kind, effect.step), 0) > 0
        if failing:
            left[(kind, effect.step)] -= 1
        event = {
            ("action", False): ActionSucceeded(effect.step),
            ("action", True): ActionFailed(effect.step, "boom"),
            ("compensation", False): CompensationSucceeded(effect.step),
            ("compensation", True): CompensationFailed(effect.step, "boom"),
        }[(kind, failing)]
        state, effects = sagas.step(saga, state, event)
    controls += [e for e in effects if isinstance(e, Control)]
    assert state.terminal, "the saga ends"
    return state, calls, controls


def test_all_steps_succeed_and_the_saga_completes() -> None:
    """Without failures every action runs once, in order, and the saga completes."""
    state, calls, controls = run(REFUND, {})
    assert state.status == COMPLETED and [c[1] for c in calls] == list(REFUND.steps)
    assert [c.event for c in controls][-1] == "saga.completed" and any(c.event == "saga.pivoted" for c in controls)


def test_a_failure_before_the_pivot_compensates_in_reverse() -> None:
    """The refund (the pivot) fails: the label is cancelled; nothing after it runs."""
    state, calls, _ = run(REFUND, {("action", "refund"): 1})
    assert state.status == COMPENSATED
    assert calls == [("action", "label", "s-1:label"), ("action", "refund", "s-1:refund"),
                     ("compensation", "label", "s-1:label:compensate")]


def test_a_failure_after_the_pivot_is_retried_to_completion_with_the_same_key() -> None:
    """Money moved: a failing notify is retried (same idempotency key) until it succeeds; nothing is compensated."""
    state, calls, controls = run(REFUND, {("action", "notify"): 3})
    assert state.status == COMPLETED
    notify = [c for c in calls if c[1] == "notify"]
    assert len(notify) == 4 and {c[2] for c in notify} == {"s-1:notify"}
    assert not any(c[0] == "compensation" for c in calls)
    assert [c.details["attempt"] for c in controls if c.event == "saga.retrying"] == [2, 3, 4]


def test_a_failing_compensation_is_retried_until_it_succeeds() -> None:
    """Compensations must complete: a failing cancel is retried with its own constant key."""
    saga = Saga("three", ("a", "b", "c"), pivot="c")
    state, calls, _ = run(saga, {("action", "c"): 1, ("compensation", "b"): 2})
    assert state.status == COMPENSATED and state.undone == ("b", "a")
    comps = [c for c in calls if c[0] == "compensation"]
    assert ([c[1] for c in comps] == ["b", "b", "b", "a"]
            and {c[2] for c in comps if c[1] == "b"} == {"s-1:b:compensate"})


def test_duplicate_and_stale_reports_change_nothing() -> None:
    """A report about a step that is not due (redelivered, or late from a dead runner) is ignored."""
    state, _ = sagas.start(REFUND, "s-1")
    state, _ = sagas.step(REFUND, state, ActionSucceeded("label"))
    assert sagas.step(REFUND, state, ActionSucceeded("label")) == (state, [])
    assert sagas.step(REFUND, state, ActionFailed("label", "late")) == (state, [])
    assert sagas.step(REFUND, state, CompensationSucceeded("label")) == (state, [])


def test_a_bad_saga_definition_is_refused() -> None:
    """Misdeclared sagas fail when defined, not halfway through a refund."""
    with pytest.raises(ValueError, match="pivot"):
        Saga("x", ("a", "b"), pivot="c")
    with pytest.raises(ValueError, match="twice"):
        Saga("x", ("a", "a"))
    with pytest.raises(ValueError, match="no steps"):
        Saga("x", ())


failures = st.dictionaries(
    st.tuples(st.sampled_from(["action", "compensation"]), st.sampled_from(REFUND.steps)), st.integers(0, 3),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(failures)
def test_any_failure_pattern_keeps_the_saga_rules(fails: dict) -> None:
    """For any pattern of failures: compensation happens only for a failure before the pivot, undoes exactly the
    steps done, newest first; after the pivot the saga always completes; every step has one idempotency key."""
    state, calls, _ = run(REFUND, fails)
    actions_failed_before_pivot = any(fails.get(("action", s), 0) > 0 for s in ("label", "refund"))
    if actions_failed_before_pivot:
        assert state.status == COMPENSATED
        assert list(state.undone) == list(reversed(state.done))
        assert "refund" not in state.done, "the pivot never completed"
    else:
        assert state.status == COMPLETED and state.done == REFUND.steps
        assert not any(c[0] == "compensation" for c in calls)
    for kind, step_name in {(c[0], c[1]) for c in calls}:
        assert len({c[2] for c in calls if (c[0], c[1]) == (kind, step_name)}) == 1
