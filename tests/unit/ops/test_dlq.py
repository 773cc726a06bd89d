"""Dead-letter tooling without a broker: references, filters and the headers of a requeue."""

from __future__ import annotations

import json

import pytest

from agents_stream.contract.topics import HISTORY_HEADER, REQUEUE_HEADER
from agents_stream.kafka.deadletters import DeadLetter, history_of
from agents_stream.ops.dlq import matches, parse_ref, requeue_headers_for


def dl(**headers: str) -> DeadLetter:
    base = {
        "error_reason": "permanent_error: 400 bad request", "error_layer": "downstream",
        "original_topic": "agent.tasks.analyzer", "original_partition": "1", "original_offset": "17",
        "failed_at": "2026-11-29T10:00:00.000Z", "attempts": "1",
    }
    return DeadLetter("agent.tasks.analyzer.dlq", 1, 5, b"t-1", b'{"task_id":"t-1"}', {**base, **headers})


def test_refs_round_trip_and_bad_ones_say_the_form() -> None:
    """`dlq list` prints refs that `dlq show` and `dlq requeue` accept; a mistyped one gets the expected form."""
    d = dl()
    assert d.ref == "agent.tasks.analyzer.dlq:1:5" and parse_ref(d.ref) == ("agent.tasks.analyzer.dlq", 1, 5)
    assert d.agent == "analyzer" and d.task_id == "t-1"
    for bad in ("agent.tasks.analyzer:1:5", "x.dlq:a:5", "nothing"):
        with pytest.raises(ValueError, match="agent.tasks.<agent>.dlq:<partition>:<offset>"):
            parse_ref(bad)


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({}, True),
        ({"agent": "analyzer"}, True),
        ({"agent": "summarizer"}, False),
        ({"layer": "downstream"}, True),
        ({"layer": "schema"}, False),
        ({"reason": "400"}, True),
        ({"reason": "BAD REQUEST"}, True),
        ({"reason": "timeout"}, False),
        ({"since": "2026-11-29T09:00:00Z", "until": "2026-11-29T11:00:00Z"}, True),
        ({"since": "2026-11-29T10:00:01"}, False),
        ({"until": "2026-11-29T09:59:59+00:00"}, False),
    ],
)
def test_filters_select_by_agent_layer_reason_and_time(filters: dict, expected: bool) -> None:
    """Operators narrow dead letters by agent, error layer, reason text and failure time."""
    assert matches(dl(), **filters) is expected


def test_requeue_headers_carry_the_whole_history() -> None:
    """A requeue carries a fresh id and every earlier failure's headers, this one last."""
    first = dl()
    headers = dict(requeue_headers_for(first, "rq-1"))
    assert headers[REQUEUE_HEADER] == b"rq-1"
    history = json.loads(headers[HISTORY_HEADER])
    assert history == [{**{k: first.headers[k] for k in first.headers}, "dead_letter": first.ref}]
    second = dl(attempts="2", **{HISTORY_HEADER: headers[HISTORY_HEADER].decode()})
    assert history_of(second) == history
    again = json.loads(dict(requeue_headers_for(second, "rq-2"))[HISTORY_HEADER])
    assert len(again) == 2 and again[0] == history[0] and again[1]["attempts"] == "2"
