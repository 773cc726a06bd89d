"""outputs: answer validation, format retries, the simplified task and the cache key, without I/O."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from agents_stream.config import AgentConfig
from agents_stream.contract.models import TaskPayload
from agents_stream.execution.outputs import (
    FormatError,
    OutputSpec,
    corrective,
    fingerprint,
    load_model,
    self_reported_confidence,
    simplify,
    with_format,
)

SCHEMA = {
    "type": "object",
    "properties": {"summary": {"type": "string"}, "score": {"type": "integer"}},
    "required": ["summary", "score"],
}


class Model(BaseModel):
    """An output model loaded by import path as ``tests.unit.execution.test_outputs:Model``."""

    summary: str
    score: int


NotAModel = 42


def _agent(**kwargs) -> AgentConfig:
    return AgentConfig(name="a", providers=["p"], **kwargs)


def _task(**kwargs) -> TaskPayload:
    return TaskPayload(task_id="t1", agent_name="a", instruction="Summarise.", **kwargs)


def test_valid_answer_returns_parsed_json() -> None:
    """An answer that matches the schema comes back as the parsed JSON value."""
    spec = OutputSpec.from_schema(SCHEMA)
    assert spec.check('{"summary": "ok", "score": 3}') == {"summary": "ok", "score": 3}


def test_not_json_message() -> None:
    """Prose instead of JSON is rejected with the decoder's reason and position."""
    with pytest.raises(FormatError, match=r"^not JSON: Expecting value at line 1 column 1$"):
        OutputSpec.from_schema(SCHEMA).check("Sure! Here is the summary.")


def test_wrong_type_message_names_the_path() -> None:
    """A value of the wrong type is reported with its JSON path and the expected type."""
    with pytest.raises(FormatError) as info:
        OutputSpec.from_schema(SCHEMA).check('{"summary": "ok", "score": "high"}')
    assert str(info.value) == "$.score: 'high' is not of type 'integer'"


def test_missing_property_message() -> None:
    """A missing required property is named plainly."""
    with pytest.raises(FormatError) as info:
        OutputSpec.from_schema(SCHEMA).check('{"score": 1}')
    assert str(info.value) == "missing required property 'summary'"


def test_nested_missing_property_names_the_parent() -> None:
    """A property missing deeper in the answer says where it is missing."""
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": {"required": ["id"]}}}}
    with pytest.raises(FormatError) as info:
        OutputSpec.from_schema(schema).check('{"items": [{"id": 1}, {}]}')
    assert str(info.value) == "$.items[1]: missing required property 'id'"


def test_nan_is_not_json() -> None:
    """NaN and Infinity, which Python's json accepts, are rejected as not JSON."""
    with pytest.raises(FormatError, match="not JSON"):
        OutputSpec.from_schema({"type": "number"}).check("NaN")


def test_long_instances_keep_the_message_short() -> None:
    """A huge wrong value does not make the rejection reason huge."""
    with pytest.raises(FormatError) as info:
        OutputSpec.from_schema({"type": "object"}).check(json.dumps(["x" * 50] * 100))
    assert len(str(info.value)) <= 300


@pytest.mark.parametrize(
    "text",
    [
        '```json\n{"summary": "ok", "score": 3}\n```',
        '```\n{"summary": "ok", "score": 3}\n```',
        '  ```JSON\n  {"summary": "ok", "score": 3}  \n```\n',
        '```{"summary": "ok", "score": 3}```',
    ],
)
def test_fenced_json_is_accepted(text: str) -> None:
    """Models wrap JSON in a Markdown fence; the fence is stripped before parsing."""
    assert OutputSpec.from_schema(SCHEMA).check(text) == {"summary": "ok", "score": 3}


def test_task_schema_overrides_agent_schema() -> None:
    """A task's own output_schema wins over the agent's."""
    agent = _agent(output_schema=SCHEMA)
    spec = OutputSpec.for_task(agent, _task(output_schema={"type": "array"}))
    assert spec is not None
    assert spec.check("[1, 2]") == [1, 2]
    with pytest.raises(FormatError):
        spec.check('{"summary": "ok", "score": 3}')


def test_task_schema_overrides_agent_model() -> None:
    """A task's own output_schema wins over the agent's output_model too."""
    agent = _agent(output_model="tests.unit.execution.test_outputs:Model")
    spec = OutputSpec.for_task(agent, _task(output_schema={"type": "string"}))
    assert spec is not None and spec.check('"plain"') == "plain"


def test_agent_schema_applies_when_task_has_none() -> None:
    """Without a task schema the agent's schema checks the answer."""
    spec = OutputSpec.for_task(_agent(output_schema=SCHEMA), _task())
    assert spec is not None and spec.schema == SCHEMA


def test_nothing_declared_means_no_spec() -> None:
    """An agent and task that declare nothing accept any text (no spec)."""
    assert OutputSpec.for_task(_agent(), _task()) is None


def test_invalid_schema_raises_value_error() -> None:
    """A schema that is itself invalid is a clear configuration error, not a format error."""
    with pytest.raises(ValueError, match=r"invalid output_schema at \$\.type"):
        OutputSpec.from_schema({"type": "strng"})
    with pytest.raises(ValueError, match="invalid output_schema"):
        OutputSpec.for_task(_agent(), _task(output_schema={"required": "summary"}))


def test_pydantic_model_by_import_path() -> None:
    """An agent's output_model is imported by path and its dump is the parsed output."""
    spec = OutputSpec.for_task(_agent(output_model="tests.unit.execution.test_outputs:Model"), _task())
    assert spec is not None and spec.model is Model
    assert spec.check('```json\n{"summary": "ok", "score": "3"}\n```') == {"summary": "ok", "score": 3}


def test_pydantic_model_errors_are_short_and_located() -> None:
    """A model rejection names each bad field like a schema rejection does."""
    spec = OutputSpec.from_model(Model)
    with pytest.raises(FormatError) as info:
        spec.check('{"score": "high"}')
    assert str(info.value) == (
        "missing required property 'summary'; "
        "$.score: Input should be a valid integer, unable to parse string as an integer"
    )
    with pytest.raises(FormatError, match=r"^not JSON: "):
        spec.check("{oops")


def test_describe_of_a_model_is_its_json_schema() -> None:
    """The prompt shows a model's JSON Schema, compactly."""
    described = json.loads(OutputSpec.from_model(Model).describe())
    assert described["required"] == ["summary", "score"]
    assert " " not in OutputSpec.from_schema(SCHEMA).describe()


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_colon_here", "must look like 'package.module:Model'"),
        ("tests.unit.no_such_module:Model", "cannot import 'tests.unit.no_such_module'"),
        ("tests.unit.execution.test_outputs:Missing", "has no attribute 'Missing'"),
        ("tests.unit.execution.test_outputs:NotAModel", "is not a pydantic BaseModel subclass"),
    ],
)
def test_bad_import_path_message(path: str, message: str) -> None:
    """A wrong output_model path fails with a message that says what is wrong with it."""
    with pytest.raises(ValueError, match=message):
        load_model(path)


def test_corrective_prompt_has_instruction_error_and_schema() -> None:
    """A format retry repeats the instruction, says why the answer was rejected and shows the schema."""
    spec = OutputSpec.from_schema(SCHEMA)
    text = corrective("Summarise the report.", "$.score: 'high' is not of type 'integer'", spec)
    assert text.startswith("Summarise the report.")
    assert "$.score: 'high' is not of type 'integer'" in text
    assert spec.describe() in text
    assert "only JSON" in text


def test_corrective_prompt_truncates_the_error() -> None:
    """A very long rejection reason is cut so the retry prompt stays small."""
    text = corrective("Go.", "x" * 5000, OutputSpec.from_schema(SCHEMA))
    assert "x" * 300 not in text and "…" in text


def test_with_format_adds_one_line_only_with_a_spec() -> None:
    """The first attempt asks for JSON only when something is declared."""
    assert with_format("Go.", None) == "Go."
    spec = OutputSpec.from_schema(SCHEMA)
    text = with_format("Go.", spec)
    assert text.startswith("Go.") and text.endswith(spec.describe()) and "only JSON" in text


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ({"confidence": "High"}, "high"),
        ({"confidence": " low "}, "low"),
        ({"confidence": "medium", "x": 1}, "medium"),
        ({"confidence": "certain"}, None),
        ({"confidence": 0.9}, None),
        ({}, None),
        (["high"], None),
        ("high", None),
    ],
)
def test_self_reported_confidence(output: object, expected: str | None) -> None:
    """Only a JSON object's "confidence" of high/medium/low (any case) counts as self-reported."""
    assert self_reported_confidence(output) == expected


def test_simplify_trims_strings_and_lists() -> None:
    """Long strings are cut with an ellipsis and lists to 20 items, at any depth."""
    instruction, context = simplify("Explain.", {"doc": "a" * 900, "rows": list(range(50)), "n": {"s": "b" * 600}})
    assert instruction.endswith("Explain.") and "brief" in instruction
    assert context["doc"] == "a" * 500 + "…"
    assert context["rows"] == list(range(20))
    assert context["n"]["s"] == "b" * 500 + "…"


def test_simplify_keeps_sorted_keys_within_budget() -> None:
    """Over budget, keys are kept in sorted order until the next would not fit."""
    context = {k: "v" * 400 for k in ("d", "b", "a", "c", "e", "f")}
    _, small = simplify("x", context, max_context_chars=1000)
    assert list(small) == ["a", "b"]
    assert len(json.dumps(small, separators=(",", ":"))) <= 1000


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=800),
    lambda children: st.lists(children, max_size=30) | st.dictionaries(st.text(max_size=20), children, max_size=8),
    max_leaves=60,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(max_size=30), json_values, max_size=30), st.integers(min_value=0, max_value=5000))
def test_simplify_is_deterministic_and_bounded(context: dict, budget: int) -> None:
    """Any context simplifies to the same result every time, within the character budget."""
    first = simplify("Do it.", context, max_context_chars=budget)
    assert first == simplify("Do it.", context, max_context_chars=budget)
    size = len(json.dumps(first[1], sort_keys=True, ensure_ascii=False, separators=(",", ":")))
    assert size <= max(budget, 2)


def test_fingerprint_ignores_key_order() -> None:
    """The same context in another key order hits the same cache entry."""
    a = fingerprint("summarizer", "Summarise.", {"x": 1, "y": {"b": 2, "a": 1}})
    b = fingerprint("summarizer", "Summarise.", {"y": {"a": 1, "b": 2}, "x": 1})
    assert a == b and len(a) == 64


def test_fingerprint_differs_by_agent_instruction_and_context() -> None:
    """Another agent, instruction or context never reuses an answer."""
    base = fingerprint("summarizer", "Summarise.", {"x": 1})
    assert base != fingerprint("translator", "Summarise.", {"x": 1})
    assert base != fingerprint("summarizer", "Summarise!", {"x": 1})
    assert base != fingerprint("summarizer", "Summarise.", {"x": 2})


def test_validators_are_compiled_once_per_schema() -> None:
    """Every task of an agent reuses one compiled validator, whatever the schema's key order."""
    reordered = {"required": ["summary", "score"], "properties": SCHEMA["properties"], "type": "object"}
    assert OutputSpec.from_schema(SCHEMA).validator is OutputSpec.from_schema(reordered).validator
