"""A round's model text streamed as chunk events: batched, bounded, marked with its call so a retried call's partial
text is superseded, never failing a call; the executor against fake LLM servers over HTTP (no broker)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from agents_stream.client import Event, StreamedText
from agents_stream.contract import topics
from agents_stream.contract.conversation_messages import round_task_id
from agents_stream.execution.agent_definitions import Agent
from agents_stream.execution.chunks import Chunks
from agents_stream.execution.tools import ToolContext, tool
from agents_stream.ops.cli_chat import _render, _Text
from agents_stream.testing.fakellm import FakeLLM, call, ok, status, tool_calls
from tests.unit.fake_worker import Worker, worker

TEXT = ("Your parcel left the depot on Monday and was lost in transit; I have refunded the 42 EUR to your card "
        "and you will get an email with the details shortly.")
ROUND = round_task_id("c-9", 3, 8, 120)


@tool
async def track(ctx: ToolContext, order: str) -> dict[str, str]:
    """Where an order is."""
    return {"order": order, "status": "delivered"}


TRACKER = Agent("tracker", instructions="You track orders.", tools=[track])


def chunks_of(w: Worker) -> list[dict[str, Any]]:
    return [json.loads(value) for _, value, _ in w.sent_events]


def fold(events: list[dict[str, Any]]) -> StreamedText:
    streamed = StreamedText()
    for offset, event in enumerate(events):
        streamed.add(Event(offset, event["kind"], event))
    return streamed


async def test_a_rounds_text_streams_and_a_cut_attempt_is_superseded_by_the_retry() -> None:
    async with FakeLLM([ok(TEXT, cut_after=4), status(503), ok(TEXT, chunk_delay=0.002)], default=None) as p:
        async with worker({"p": p}, {"providers": ["p"]}, settings={"partitions": 8}) as w:
            w.dispatch(ROUND, dispatch=2)
            out = await w.outcome(ROUND)
    assert (out["status"], out["output"], out["calls"]) == ("succeeded", TEXT, 3)
    assert all(r.body["stream"] is True for r in p.requests)
    events = chunks_of(w)
    key = b"c-9"
    assert {k for k, _, _ in w.sent_events} == {key}
    assert {part for _, _, part in w.sent_events} == {topics.partition_for(key, 8)}
    assert {e["kind"] for e in events} == {"chunk"} and {e["round"] for e in events} == {3}
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        assert e["conversation_id"] == "c-9" and e["data"]["turn"] == 0 and e["data"]["dispatch"] == 2
        by_attempt.setdefault(e["data"]["attempt"], []).append(e["data"])
    assert sorted(by_attempt) == [1, 3]  # the 503 of call 2 streamed nothing
    first = "".join(d["text"] for d in by_attempt[1])
    assert first and TEXT.startswith(first) and first != TEXT
    winner = by_attempt[3]
    assert [d["seq"] for d in winner] == list(range(len(winner))) and "".join(d["text"] for d in winner) == TEXT
    assert len(winner) < len(TEXT.split()) // 2  # batched: far fewer chunks than the pieces the fake sent
    assert len({e["id"] for e in events}) == len(events)
    assert all(e["id"] == f"round:3:chunk:2:{e['data']['attempt']}:{e['data']['seq']}" for e in events)
    assert fold(events).text(3, 0) == TEXT


async def test_a_task_that_is_not_a_round_does_not_stream() -> None:
    async with FakeLLM([ok(TEXT)], default=None) as p:
        async with worker({"p": p}, {"providers": ["p"]}) as w:
            w.dispatch("t-1")
            out = await w.outcome("t-1")
    assert out["output"] == TEXT and w.sent_events == [] and "stream" not in p.requests[0].body


async def test_streaming_can_be_turned_off() -> None:
    async with FakeLLM([ok(TEXT)], default=None) as p:
        async with worker({"p": p}, {"providers": ["p"]}, settings={"partitions": 8, "stream_text": False}) as w:
            w.dispatch(ROUND)
            out = await w.outcome(ROUND)
    assert out["output"] == TEXT and w.sent_events == [] and "stream" not in p.requests[0].body


async def test_an_agent_loops_turns_stream_under_their_turn_numbers() -> None:
    agent = {"providers": ["p"], "agent": "tests.unit.execution.test_chunks:TRACKER"}
    script = [tool_calls(call("track", {"order": "o-7"}, id="c1"), text="Let me look that order up."),
              ok("It was delivered yesterday.")]
    async with FakeLLM(script, default=None) as p:
        async with worker({"p": p}, agent, settings={"partitions": 8}) as w:
            w.dispatch(ROUND, instruction="where is o-7?", context_data={"order_id": "o-7"})
            out = await w.outcome(ROUND)
    assert out["status"] == "succeeded"
    streamed = fold(chunks_of(w))
    assert streamed.text(3, 0) == "Let me look that order up."
    assert streamed.text(3, 1) == "It was delivered yesterday."


def _stream(sent: list[Any], **bounds: Any) -> Any:
    chunks = Chunks(lambda key, value, partition: sent.append(json.loads(value)), 8, **bounds)
    stream = chunks.open(ROUND, 1, 1, 0)
    assert stream is not None and chunks.open("t-1", 1, 1, 0) is None
    return stream


async def test_pieces_are_batched_by_time_and_size_and_bounded_per_call() -> None:
    sent: list[dict[str, Any]] = []
    stream = _stream(sent, flush_s=0.05, chunk_chars=10, max_chars=25)
    stream.write("ab")
    stream.write("cd")
    assert sent == []  # waits for the flush interval
    await asyncio.sleep(0.1)
    assert [e["data"]["text"] for e in sent] == ["abcd"]
    stream.write("0123456789xyz")  # past chunk_chars: sent at once
    assert [e["data"]["text"] for e in sent][1:] == ["0123456789", "xyz"]
    stream.write("more text than the bound allows")
    stream.write("ignored")
    stream.close()
    texts = [e["data"]["text"] for e in sent]
    assert "".join(texts) == "abcd0123456789xyzmore tex" and sent[-1]["data"]["cut"] is True
    assert [e["data"]["seq"] for e in sent] == list(range(len(sent)))
    assert not any(e["data"]["cut"] for e in sent[:-1])


async def test_a_failing_send_never_fails_the_call_and_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    def broken(key: bytes, value: bytes, partition: int) -> None:
        raise RuntimeError("the producer is gone")

    stream = Chunks(broken, 8, chunk_chars=1).open(ROUND, 1, 1, 0)
    assert stream is not None
    with caplog.at_level(logging.WARNING, logger="agents_stream.execution.chunks"):
        for piece in "several pieces":
            stream.write(piece)
        stream.close()
    assert len([r for r in caplog.records if "could not be sent" in r.message]) == 1


def test_a_later_call_supersedes_an_earlier_ones_text() -> None:
    def chunk(dispatch: int, attempt: int, seq: int, text: str, turn: int = 0) -> Event:
        data = {"turn": turn, "dispatch": dispatch, "attempt": attempt, "seq": seq, "text": text, "cut": False}
        return Event(seq, "chunk", {"id": f"round:1:chunk:{dispatch}:{attempt}:{seq}", "kind": "chunk", "round": 1,
                                    "data": data})

    streamed = StreamedText()
    assert streamed.add(chunk(1, 1, 0, "Hel")).restart  # type: ignore[union-attr]
    assert not streamed.add(chunk(1, 1, 1, "lo")).restart  # type: ignore[union-attr]
    assert streamed.text(1, 0) == "Hello"
    assert streamed.add(chunk(1, 2, 0, "Hi")).restart  # type: ignore[union-attr]  # the retry
    assert streamed.add(chunk(1, 1, 2, " there")) is None  # a late chunk of the failed call
    assert streamed.add(chunk(2, 1, 0, "Hey")).restart  # type: ignore[union-attr]  # a takeover's dispatch
    assert streamed.add(chunk(1, 5, 0, "stale")) is None
    assert streamed.text(1, 0) == "Hey" and streamed.add(Event(9, "turn", {"data": {}})) is None


def test_the_chat_prints_streamed_text_once_and_marks_a_superseded_call() -> None:
    printed: list[str] = []

    def say(text: str, end: str = "\n") -> None:
        printed.append(text + end)

    def chunk(attempt: int, seq: int, text: str) -> Event:
        data = {"turn": 0, "dispatch": 1, "attempt": attempt, "seq": seq, "text": text, "cut": False}
        return Event(seq, "chunk", {"id": f"round:1:chunk:1:{attempt}:{seq}", "kind": "chunk", "round": 1,
                                    "data": data})

    shown = _Text(say)
    for event in (chunk(1, 0, "Hel"), chunk(2, 0, "Hello,\n"), chunk(1, 1, "lo"), chunk(2, 1, "you\x1b[2J")):
        assert shown.chunk(event)
    reply = Event(9, "reply", {"id": "reply:1", "kind": "reply", "round": 1,
                               "data": {"status": "succeeded", "text": "Hello,\nyou\x1b[2J"}})
    assert not shown.chunk(reply) and shown.shown(reply) and _render(reply)
    shown.end()
    screen = "".join(printed)
    assert screen == "agent> Hel\n  (that call failed; the agent writes again)\nagent> Hello,\nyou\\x1b[2J\n", screen
