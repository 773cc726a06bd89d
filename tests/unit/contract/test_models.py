"""parse_task() and the topic records: every unusable message gets its own poison reason."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agents_stream.contract.errors import PoisonMessage
from agents_stream.contract.models import ControlEvent, TaskPayload, TaskResult, Usage, parse_task

AGENT = "analyzer"
LIMIT = 262_144
VALID: dict[str, Any] = {
    "task_id": "3f0c8a1e-6a1b-4c55-9f0e-2b1d3c4e5f60",
    "agent_name": AGENT,
    "instruction": "Summarise the quarter.",
    "context_data": {"revenue": [1, 2, 3]},
    "job_id": "job-7",
    "priority": 5,
    "risk_level": "high",
}


def raw(data: Any) -> bytes:
    return json.dumps(data).encode("utf-8")


def poison_reason(value: bytes | None, *, agent: str = AGENT, max_bytes: int = LIMIT) -> PoisonMessage:
    with pytest.raises(PoisonMessage) as info:
        parse_task(value, agent=agent, max_bytes=max_bytes)
    return info.value


def test_valid_payload_parses() -> None:
    """A well-formed task for this topic's agent comes back typed, field for field."""
    task = parse_task(raw(VALID), agent=AGENT, max_bytes=LIMIT)
    assert task == TaskPayload(**VALID)
    assert task.priority == 5
    assert task.context_data == {"revenue": [1, 2, 3]}
    assert task.schema_version == 1


def test_minimal_payload_gets_defaults() -> None:
    """Only task_id, agent_name and instruction are required; the rest defaults."""
    task = parse_task(raw({"task_id": "t", "agent_name": AGENT, "instruction": "go"}), agent=AGENT, max_bytes=LIMIT)
    assert task.context_data == {}
    assert task.priority is None and task.job_id is None and task.risk_level is None


def test_unknown_fields_are_accepted() -> None:
    """A producer on a newer schema adding fields is not dead-lettered (evolution)."""
    task = parse_task(raw({**VALID, "tenant": "acme", "schema_version": 2}), agent=AGENT, max_bytes=LIMIT)
    assert task.task_id == VALID["task_id"]
    assert not hasattr(task, "tenant")


def test_null_value_is_poison() -> None:
    """A tombstone (no value) is dead-lettered as null_value."""
    assert poison_reason(None).reason == "null_value"


def test_oversized_payload_is_poison() -> None:
    """A payload over the byte limit is dead-lettered as payload_too_large, before it is decoded."""
    body = raw(VALID)
    assert poison_reason(body, max_bytes=len(body) - 1).reason == "payload_too_large"
    assert poison_reason(b"\xff" * 100, max_bytes=99).reason == "payload_too_large"


def test_payload_at_the_limit_is_accepted() -> None:
    """The limit is inclusive: a payload of exactly max_bytes is processed."""
    body = raw(VALID)
    assert parse_task(body, agent=AGENT, max_bytes=len(body)).task_id == VALID["task_id"]


def test_limit_counts_bytes_not_characters() -> None:
    """Multi-byte UTF-8 counts by its encoded size, which is what the broker stores."""
    body = raw({**VALID, "instruction": "é" * 50}).replace(b"\\u00e9", "é".encode())
    assert poison_reason(body, max_bytes=len(body) - 1).reason == "payload_too_large"


@pytest.mark.parametrize("value", [b"\xff\xfe{}", b'{"task_id": "\xc3"}', b"\x80"])
def test_invalid_utf8_is_poison(value: bytes) -> None:
    """Bytes that are not UTF-8 are dead-lettered as invalid_utf8."""
    assert poison_reason(value).reason == "invalid_utf8"


@pytest.mark.parametrize("value", [b"", b"not json", b"{'task_id': 1}", b'{"task_id": "t",', b"{} {}"])
def test_non_json_is_poison(value: bytes) -> None:
    """Text that does not parse as JSON is dead-lettered as not_json."""
    assert poison_reason(value).reason == "not_json"


@pytest.mark.parametrize("value", [b"[]", b"[1, 2]", b'"a string"', b"42", b"null", b"true"])
def test_json_that_is_not_an_object_is_schema_violation(value: bytes) -> None:
    """Valid JSON that is not an object (a list, a string, null) is a schema_violation."""
    assert poison_reason(value).reason == "schema_violation"


def test_seed_bad_payload_is_schema_violation_naming_the_fields() -> None:
    """The seed's bad task is dead-lettered as schema_violation with the offending fields named."""
    exc = poison_reason(raw({"task_id": "invalid-uuid-format", "agent_name": 12345, "instruction": None}))
    assert exc.reason == "schema_violation"
    assert "agent_name" in exc.detail
    assert "instruction" in exc.detail


@pytest.mark.parametrize(
    "change",
    [
        {"instruction": None},
        {"priority": "5"},
        {"priority": 5.5},
        {"priority": True},
        {"context_data": []},
        {"context_data": "x=1"},
        {"context_data": None},
        {"task_id": ""},
        {"task_id": 17},
        {"agent_name": ""},
        {"risk_level": "apocalyptic"},
        {"steps": {"a": 1}},
    ],
    ids=lambda c: f"{next(iter(c))}={next(iter(c.values()))!r}",
)
def test_wrong_field_types_are_schema_violations(change: dict[str, Any]) -> None:
    """Fields are strict: no coercion of strings to ints, no non-object context, no empty ids."""
    exc = poison_reason(raw({**VALID, **change}))
    assert exc.reason == "schema_violation"
    assert next(iter(change)) in exc.detail


@pytest.mark.parametrize("missing", ["task_id", "agent_name", "instruction"])
def test_missing_required_field_is_schema_violation(missing: str) -> None:
    """A task without an id, an agent or an instruction is a schema_violation."""
    data = {k: v for k, v in VALID.items() if k != missing}
    exc = poison_reason(raw(data))
    assert exc.reason == "schema_violation"
    assert missing in exc.detail


def test_agent_mismatch_is_poison() -> None:
    """A task naming another agent than its topic's is dead-lettered, not run by the wrong agent."""
    exc = poison_reason(raw({**VALID, "agent_name": "summarizer"}))
    assert exc.reason == "agent_mismatch"
    assert "summarizer" in exc.detail and AGENT in exc.detail


@pytest.mark.parametrize("value", [b"[" * 5_000, b'{"a":' * 5_000], ids=["arrays", "objects"])
def test_deeply_nested_json_is_poison(value: bytes) -> None:
    """A small but deeply nested payload is dead-lettered, not an exception that holds the partition for ever."""
    assert len(value) < LIMIT
    exc = poison_reason(value)
    assert exc.reason in {"not_json", "schema_violation"}


def test_task_result_round_trips_through_json() -> None:
    """A TaskResult written to agent.results reads back identical."""
    result = TaskResult(
        task_id="t-1", agent_name=AGENT, status="failed", output={"answer": [1, 2]}, confidence="failed",
        source="gemini", attempts=2, usage=Usage(input_tokens=10, output_tokens=3, cost=0.001),
        job_id="job-7", error="http_400",
    )
    again = TaskResult.model_validate_json(result.model_dump_json())
    assert again == result
    assert again.completed_at.endswith("Z")


def test_task_result_ignores_unknown_fields() -> None:
    """A consumer on the old schema still reads a result with new fields."""
    data = json.loads(TaskResult(task_id="t", agent_name=AGENT, status="succeeded").model_dump_json())
    data["trace_id"] = "abc"
    assert TaskResult.model_validate(data).task_id == "t"


def test_control_event_round_trips_through_json() -> None:
    """A ControlEvent on agent.control reads back identical."""
    event = ControlEvent(event="task.failed", subject="t-1", agent_name=AGENT, worker="w-1", details={"reason": "x"})
    assert ControlEvent.model_validate_json(event.model_dump_json()) == event


def test_task_id_with_control_characters_is_poison() -> None:
    """A task_id with control characters (e.g. one posing as an internal table key) is dead-lettered, never stored."""
    body = raw({**VALID, "task_id": "\x00spend/analyzer/2026-01-01/0"})
    with pytest.raises(PoisonMessage) as info:
        parse_task(body, agent=AGENT, max_bytes=LIMIT)
    assert info.value.reason == "schema_violation" and "task_id" in str(info.value)


def test_a_task_with_more_steps_than_the_limit_is_poison():
    """Each step's answer is kept in the task's one record: more steps than AGENTS_STREAM_MAX_STEPS is refused
    at intake (too_many_steps), as many as the limit is not."""
    def body(steps: int) -> bytes:
        return json.dumps({"task_id": "t", "agent_name": "a", "instruction": "i", "steps": ["s"] * steps}).encode()

    assert len(parse_task(body(4), agent="a", max_bytes=10_000, max_steps=4).steps or []) == 4
    with pytest.raises(PoisonMessage) as caught:
        parse_task(body(5), agent="a", max_bytes=10_000, max_steps=4)
    assert caught.value.reason == "too_many_steps"


def test_the_task_digest_is_of_the_task_not_of_its_bytes():
    """Two messages are the same task when their canonical fields agree (key order, whitespace, unknown fields
    and defaults spelled out do not count); any field that differs makes another task."""
    from agents_stream.contract.models import task_digest

    one = TaskPayload.model_validate_json('{"task_id": "t", "agent_name": "a", "instruction": "i"}')
    same = TaskPayload.model_validate_json(
        '{"instruction":"i","agent_name":"a","task_id":"t","context_data":{},"extra":1,"steps":null}'
    )
    assert task_digest(one) == task_digest(same)
    for other in ({"instruction": "j"}, {"agent_name": "b"}, {"context_data": {"k": 1}}, {"job_id": "j"}):
        assert task_digest(one.model_copy(update=other)) != task_digest(one)
