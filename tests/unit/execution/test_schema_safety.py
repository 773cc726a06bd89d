"""Schemas from tasks and config fetch nothing, stay bounded, and a backtracking pattern cannot hold the loop.

The server a schema points at is real (a socket that accepts and never answers, in its own thread so a
blocked event loop cannot hide it); the providers are fake LLM servers over HTTP (fake_worker).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agents_stream.execution.outputs import CheckAborted, FormatError, OutputSpec
from agents_stream.execution.schemas import MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH
from agents_stream.testing.fakellm import FakeLLM, ok
from agents_stream.testing.silent import SilentServer
from tests.unit.fake_worker import worker


def _remote_schemas(url: str) -> list[dict[str, Any]]:
    return [
        {"$ref": url},
        {"type": "object", "properties": {"a": {"items": {"$ref": url}}}},
        {"$dynamicRef": url},
        {"$id": url, "properties": {"a": {"$ref": "other.json"}}},  # relative to a remote base: as remote
    ]


def test_a_remote_ref_is_refused_when_the_schema_is_compiled_and_nothing_is_fetched() -> None:
    """A $ref (anywhere, or relative to a remote $id) that leaves the schema is a bad schema: no connection."""
    with SilentServer().running() as server:
        for schema in _remote_schemas(server.url):
            with pytest.raises(ValueError, match=r"is not local: only references inside the schema"):
                OutputSpec.from_schema(schema)
        time.sleep(0.2)  # a connection attempt would have been accepted by now
        assert server.connections == 0


def test_local_refs_still_work_and_one_to_nowhere_is_a_clear_failure() -> None:
    """References inside the schema resolve as before; a pointer to nothing aborts the check with a reason."""
    spec = OutputSpec.from_schema({"$defs": {"n": {"type": "integer"}}, "items": {"$ref": "#/$defs/n"}})
    assert spec.check("[1, 2]") == [1, 2]
    with pytest.raises(FormatError, match=r"\$\[1\]: 'x' is not of type 'integer'"):
        spec.check('[1, "x"]')
    with pytest.raises(CheckAborted, match="cannot be resolved inside the schema"):
        OutputSpec.from_schema({"$ref": "#/$defs/missing"}).check("1")
    with pytest.raises(CheckAborted, match="recursed too deeply"):
        OutputSpec.from_schema({"$ref": "#"}).check("1")


def test_a_schema_over_the_size_or_depth_bound_is_refused() -> None:
    """A schema of more than MAX_SCHEMA_BYTES or nested deeper than MAX_SCHEMA_DEPTH is not compiled."""
    big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(MAX_SCHEMA_BYTES // 20)}}
    with pytest.raises(ValueError, match=rf"bytes of JSON > the limit of {MAX_SCHEMA_BYTES}"):
        OutputSpec.from_schema(big)
    deep: dict[str, Any] = {"type": "integer"}
    for _ in range(MAX_SCHEMA_DEPTH):
        deep = {"items": deep}
    with pytest.raises(ValueError, match=rf"nested deeper than {MAX_SCHEMA_DEPTH} levels"):
        OutputSpec.from_schema(deep)


def test_patterns_keep_their_meaning_on_the_bounded_engine() -> None:
    """pattern, patternProperties and additionalProperties with patterns decide as jsonschema's own do."""
    spec = OutputSpec.from_schema({
        "type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]+-[0-9]+$"}},
        "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False,
    })
    assert spec.check('{"id": "ab-12", "x-n": 3}') == {"id": "ab-12", "x-n": 3}
    for answer, why in [('{"id": "AB-12"}', r"\$\.id: 'AB-12' does not match"), ('{"x-n": "s"}', r"\$\.x-n: 's' is"),
                        ('{"y": 1}', r"^'y' does not match any of the regexes: '\^x-'$")]:
        with pytest.raises(FormatError, match=why):
            spec.check(answer)
    with pytest.raises(ValueError, match="unevaluatedProperties with patternProperties is not supported"):
        OutputSpec.from_schema({"patternProperties": {"^a": {}}, "unevaluatedProperties": False})


def test_a_catastrophic_pattern_stops_at_the_budget_with_a_clear_reason() -> None:
    """^(a|aa)+$ against forty a's and a "!" backtracks without end: the check stops at its budget, saying so."""
    spec = OutputSpec.from_schema({"type": "string", "pattern": "^(a|aa)+$"})
    start = time.thread_time()  # the budget is CPU time: a loaded machine stretches the clock, not the work
    with pytest.raises(CheckAborted, match=r"pattern '\^\(a\|aa\)\+\$' ran out of time on a string of 41 characters"):
        spec.check('"' + "a" * 40 + '!"', budget_s=0.2)
    assert time.thread_time() - start < 0.7


async def test_the_check_runs_off_the_loop() -> None:
    """While a slow check runs, the event loop keeps its turns (the thread's regex engine releases the GIL)."""
    spec = OutputSpec.from_schema({"type": "string", "pattern": "^(a|aa)+$"})
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.01)
            gaps.append(time.monotonic() - last)
            last = time.monotonic()

    tick = asyncio.create_task(ticker())
    with pytest.raises(CheckAborted):
        await asyncio.wait_for(spec.check_async('"' + "a" * 40 + '!"', budget_s=2.0), timeout=60)
    done.set()
    await tick
    # on the loop the check would hold it for the whole budget; the bound leaves room for a loaded machine
    assert len(gaps) > 10 and max(gaps) < 1.0, f"the loop stalled: longest gap {max(gaps):.2f}s"


async def test_a_task_whose_schema_points_at_a_server_fails_and_the_server_is_never_reached() -> None:
    """A task's output_schema with a remote $ref: the task fails as invalid_output_schema, no provider call and
    no connection; today the check fetches it with no timeout, on the loop, for as long as the server holds on."""
    with SilentServer().running() as server:
        async with FakeLLM([ok('{"n": 1}')], default=None) as p:
            async with worker({"p": p}, {"providers": ["p"], "format_retries": 0}) as w:
                w.dispatch("t1", output_schema={"$ref": server.url})
                out = await w.outcome("t1", timeout=15)
        assert out["kind"] == "failed" and out["reason"] == "invalid_output_schema", out
        assert "is not local" in out["error"] and len(p.requests) == 0
        assert server.connections == 0


async def test_an_agent_schema_that_points_at_a_server_stops_the_worker_at_start() -> None:
    """The same rules hold for an agent's configured output_schema: a configuration error naming the agent."""
    with SilentServer().running() as server:
        async with FakeLLM(default=None) as p:
            with pytest.raises(ValueError, match=r"agent 'a': invalid output_schema: \$ref .* is not local"):
                async with worker({"p": p}, {"providers": ["p"], "output_schema": {"$ref": server.url}}):
                    pass
        assert server.connections == 0


@pytest.mark.parametrize(("pattern", "text", "reason"), [
    # on Python's re this takes seconds (exponential); the regex engine answers at once: no match
    ("^(a+)+$", "a" * 27 + "!", "invalid_output: $.n: "),
    # this one is slow on both engines: the budget (AGENTS_STREAM_OUTPUT_CHECK_BUDGET_S, 1 CPU second) stops it
    ("^(a|aa)+$", "a" * 36 + "!", "output_check_aborted: pattern '^(a|aa)+$' ran out of time"),
])
async def test_a_backtracking_pattern_neither_stalls_the_loop_nor_other_tasks(pattern: str, text: str,
                                                                              reason: str) -> None:
    """A task's pattern that backtracks fails that task with its reason; meanwhile the loop keeps running and the
    worker answers another task."""
    answer = '{"n": "' + text + '"}'
    schema = {"type": "object", "properties": {"n": {"type": "string", "pattern": pattern}}}
    gaps: list[float] = []
    async with FakeLLM(default=ok(answer)) as p:
        async with worker({"p": p}, {"providers": ["p"], "format_retries": 0}) as w:  # the default budget
            stop = asyncio.Event()

            async def ticker() -> None:
                last = time.monotonic()
                while not stop.is_set():
                    await asyncio.sleep(0.01)
                    gaps.append(time.monotonic() - last)
                    last = time.monotonic()

            tick = asyncio.create_task(ticker())
            w.dispatch("evil", output_schema=schema)
            w.dispatch("plain")
            plain = await w.outcome("plain", timeout=60)
            evil = await w.outcome("evil", timeout=60)
            stop.set()
            await tick
    assert plain["kind"] == "succeeded" and plain["output"] == answer
    assert evil["kind"] == "failed" and evil["reason"].startswith(reason), evil["reason"]
    assert max(gaps) < 0.8, f"the event loop stalled for {max(gaps):.1f}s"  # on the loop: seconds


def test_a_schema_that_multiplies_its_own_work_stops_at_the_budget() -> None:
    """Thirty levels of allOf over two $refs to the level below is 2**30 checks of one integer: stopped in time."""
    defs: dict[str, Any] = {"d0": {"type": "integer"}}
    for i in range(1, 30):
        defs[f"d{i}"] = {"allOf": [{"$ref": f"#/$defs/d{i - 1}"}, {"$ref": f"#/$defs/d{i - 1}"}]}
    spec = OutputSpec.from_schema({"$defs": defs, "$ref": "#/$defs/d29"})
    start = time.thread_time()
    with pytest.raises(CheckAborted, match="checking the answer ran out of time"):
        spec.check("1", budget_s=0.3)
    assert time.thread_time() - start < 0.8
