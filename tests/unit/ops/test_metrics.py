"""The pure parts of the metrics: label values, consumer lag, the exposition, what counts as a task's end."""

from __future__ import annotations

import asyncio
import uuid

import aiohttp
import pytest
from agents_stream.tables import leases
from agents_stream.tables.definitions import Tables
from agents_stream.tables.leases import (
    AWAITING_APPROVAL,
    DEAD_LETTERED,
    FAILED,
    REJECTED,
    RUNNING,
    SUCCEEDED,
    TaskRecord,
)
from faust.types import TP
from prometheus_client.parser import text_string_to_metric_families

from agents_stream.contract.errors import PermanentError, RateLimited, TransientError
from agents_stream.ledger.ledger import Ledger
from agents_stream.ops import metrics
from agents_stream.ops.notify import Notifier
from agents_stream.settings import Settings
from tests.unit.ledger_fakes import NoRuns, PlainTable, recording_outbox


def _raised_from(cause: BaseException) -> TransientError:
    try:
        try:
            raise cause
        except BaseException as exc:
            raise TransientError("p could not be reached", provider="p") from exc
    except TransientError as err:
        return err


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (RateLimited("429", provider="p", retry_after=2.0), "rate_limited"),
        (_raised_from(TimeoutError()), "timeout"),
        (_raised_from(aiohttp.ServerTimeoutError()), "timeout"),
        (asyncio.TimeoutError(), "timeout"),  # the executor's own bound around a call
        (_raised_from(aiohttp.ClientConnectionError("refused")), "connection"),
        (TransientError("p answered 503", provider="p"), "server_error"),
        (RuntimeError("a bug"), "unexpected"),
    ],
)
def test_retry_reason_is_one_of_five_labels(exc: BaseException, reason: str) -> None:
    """A retry's reason label comes from the error's class and cause, never its message, so it stays a small set."""
    assert metrics.retry_reason(exc) == reason


def test_retry_reasons_stay_a_small_set() -> None:
    """Whatever is raised, the label is one of the five documented values."""
    errors = [RateLimited("x"), TransientError("x"), PermanentError("x"), ValueError("x"), _raised_from(OSError())]
    assert {metrics.retry_reason(e) for e in errors} <= {"rate_limited", "timeout", "connection", "server_error",
                                                         "unexpected"}


def test_consumer_lag_sums_partitions_per_topic() -> None:
    """Lag per topic is the sum over its partitions of end minus position."""
    ends = {TP("a", 0): 10, TP("a", 1): 5, TP("b", 0): 7}
    positions = {TP("a", 0): 4, TP("a", 1): 5, TP("b", 0): 0}
    assert metrics.consumer_lag(ends, positions) == {"a": 6, "b": 7}


def test_consumer_lag_counts_unknown_partitions_as_zero_and_never_goes_negative() -> None:
    """A partition with no fetched end or no position yet adds nothing; a stale end below the position is 0,
    not negative."""
    ends = {TP("a", 0): None, TP("a", 1): 3, TP("a", 2): 9, TP("a", 3): 2}
    positions = {TP("a", 0): 1, TP("a", 1): None, TP("a", 2): 8, TP("a", 3): 5}
    assert metrics.consumer_lag(ends, positions) == {"a": 1}


def test_consumer_lag_names_every_topic_asked_for() -> None:
    """A topic whose partitions all moved to another worker reads 0 instead of keeping its last value."""
    assert metrics.consumer_lag({}, {}, ["a", "b"]) == {"a": 0, "b": 0}


def _scrape(**kwargs) -> dict[tuple[str, tuple], float]:
    body, content_type = metrics.render(kwargs.pop("circuits", {}), kwargs.pop("held", 0), **kwargs)
    assert content_type.startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def test_render_sets_the_scrape_time_gauges() -> None:
    """Leases, approvals per agent, lag per topic, held tasks and breaker state come from the values
    passed at scrape time."""
    agent, topic, provider = (f"{p}-{uuid.uuid4().hex[:8]}" for p in ("agent", "topic", "provider"))
    got = _scrape(
        circuits={provider: {"state": "half_open", "opens": 3}}, held=2, agents=[agent], leases_now=5,
        approvals={agent: 4}, lag={topic: 11},
    )
    assert got[("agents_stream_leases_held", ())] == 5
    assert got[("agents_stream_tasks_held", ())] == 2
    assert got[("agents_stream_approvals_pending", (("agent", agent),))] == 4
    assert got[("agents_stream_consumer_lag_messages", (("topic", topic),))] == 11
    assert got[("agents_stream_breaker_state", (("provider", provider),))] == 1
    assert got[("agents_stream_breaker_opens", (("provider", provider),))] == 3
    assert got[("agents_stream_provider_calls_in_flight", (("provider", provider),))] == 0

    again = _scrape(agents=[agent], approvals={agent: 0}, lag={topic: 0})
    assert again[("agents_stream_approvals_pending", (("agent", agent),))] == 0, (
        "a gauge falls back, it is not left behind")
    assert again[("agents_stream_consumer_lag_messages", (("topic", topic),))] == 0


def test_render_shows_every_agents_task_outcomes_from_zero() -> None:
    """Each terminal outcome of each agent is exposed at 0 before its first task, so rate() sees the first increment."""
    agent = f"agent-{uuid.uuid4().hex[:8]}"
    got = _scrape(agents=[agent])
    for outcome in metrics.TASK_OUTCOMES:
        assert got[("agents_stream_tasks_total", (("agent", agent), ("outcome", outcome)))] == 0
    metrics.tasks.labels(agent, "succeeded").inc()
    assert _scrape(agents=[agent])[("agents_stream_tasks_total", (("agent", agent), ("outcome", "succeeded")))] == 1


def test_task_outcomes_are_the_ledgers_terminal_states() -> None:
    """The outcome label values are exactly the states a task can end in."""
    assert set(metrics.TASK_OUTCOMES) == set(leases.TERMINAL)


def test_every_metric_follows_the_naming_rule() -> None:
    """agents_stream_<noun>_<unit>, counters exposed as _total (the dashboard and docs/metrics.md rely on the names)."""
    for family in metrics.REGISTRY.collect():
        assert family.name.startswith("agents_stream_"), family.name
        for sample in family.samples:
            if family.type == "counter" and not sample.name.endswith("_created"):
                assert sample.name == family.name + "_total", sample.name


# -- what the ledger counts ---------------------------------------------------------------


def _record(state: str, agent: str = "a", partition: int = 0) -> TaskRecord:
    return TaskRecord(
        state=state, agent=agent, dispatch=1, owner="w", lease_until=0.0, payload="{}", topic=f"agent.tasks.{agent}",
        partition=partition, offset=0, received_at=0.0,
    )


@pytest.mark.parametrize("state", [SUCCEEDED, FAILED, DEAD_LETTERED, REJECTED])
def test_a_task_ends_once(state: str) -> None:
    """The transition into a terminal state ends the task; the same record again (a redelivery) ends nothing."""
    assert leases.ended(_record(RUNNING), _record(state)) == state
    assert leases.ended(_record(AWAITING_APPROVAL), _record(state)) == state
    assert leases.ended(_record(state), _record(state)) is None
    assert leases.ended(None, None) is None
    assert leases.ended(_record(RUNNING), _record(RUNNING)) is None


def test_a_requeued_task_that_ends_again_counts_again() -> None:
    """A requeue (terminal → running) is a new run: its end counts as a new outcome."""
    assert leases.ended(_record(DEAD_LETTERED), _record(RUNNING)) is None
    assert leases.ended(_record(RUNNING), _record(FAILED)) == FAILED


def _ledger() -> Ledger:
    outbox, _ = recording_outbox()  # nothing is sent: the ledger's scanner is all these tests read
    tables = Tables(tasks=PlainTable(), answers=PlainTable(), jobs=PlainTable(), timers=PlainTable())
    return Ledger(
        Settings(), executor=NoRuns(), worker_id="w",
        tables=tables, watermark=outbox.watermark, outbox=outbox, notifier=Notifier(),
    )


def test_approvals_pending_follow_the_records_and_the_partitions() -> None:
    """Parked tasks count per agent until decided; a revoked partition's parked tasks are the next owner's to count."""
    ledger = _ledger()
    ledger.scanner.note("t1", _record(AWAITING_APPROVAL, "refunds", partition=0))
    ledger.scanner.note("t2", _record(AWAITING_APPROVAL, "refunds", partition=1))
    ledger.scanner.note("t3", _record(RUNNING, "analyzer"))
    assert ledger.approvals_pending(["refunds", "analyzer"]) == {"refunds": 2, "analyzer": 0}
    ledger.scanner.note("t1", _record(RUNNING, "refunds", partition=0))  # approved
    assert ledger.approvals_pending(["refunds", "analyzer"]) == {"refunds": 1, "analyzer": 0}
    ledger.forget({TP("agent.tasks.refunds", 1)})
    assert ledger.approvals_pending(["refunds"]) == {"refunds": 0}
    assert len(ledger.open_tasks) == 2, "the running ones are the leases held"
