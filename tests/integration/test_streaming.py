"""Token streaming on the real broker: a client following a conversation's events over SSE (agents_stream.client)
sees the round's text in chunks as the fake LLM writes it (a real streamed answer over HTTP), before the reply; the
call whose stream was cut midway is superseded by its retry, and the reply's text is the winning call's text."""

from __future__ import annotations

import asyncio
import time

from agents_stream.client import Client, Event, StreamedText
from agents_stream.testing.fakellm import ok

from .harness import unique
from .test_agents import agent_toml, providers_toml
from .test_conversations import TOKEN, _worker_url

TEXT = ("I am sorry your parcel never came. I checked the carrier's records and it was lost on the way, so I have "
        "started a refund of the full amount; it will reach your card within five working days.")


async def test_a_rounds_text_streams_to_the_client_before_the_reply_and_a_cut_call_is_superseded(
    cluster_factory, fake_llm,
):
    agent = unique("support")
    toml = providers_toml(fake_llm.url, ("openai",)) + agent_toml(agent, ["p_openai"])
    c = cluster_factory([agent], None, toml=toml, AGENTS_STREAM_API_TOKEN=TOKEN)
    worker = await c.started("a")
    cid = unique("conv")
    # the first call's stream is cut after a few words (a retryable failure); its retry streams the whole text
    fake_llm.enqueue(ok(TEXT, cut_after=3, chunk_delay=0.05), ok(TEXT, chunk_delay=0.08))
    seen: list[tuple[float, Event]] = []

    async def watch() -> None:
        async with Client(_worker_url(worker), TOKEN) as client:
            async for event in client.events(cid, timeout=120):
                seen.append((time.monotonic(), event))
                if event.kind == "reply":
                    return

    async with Client(_worker_url(worker), TOKEN) as client:
        sent = await client.send(cid, agent, "my parcel never came")
        watching = asyncio.create_task(watch())
        reply = await client.reply(cid, sent.message_id, timeout=90)
        await asyncio.wait_for(watching, 60)
    assert reply["status"] == "succeeded" and reply["text"] == TEXT
    streamed = [r for r in fake_llm.requests if r.body.get("stream") is True]
    assert len(streamed) == 2, "both calls of the round asked for a streamed answer"

    events = [e for _, e in seen]
    ids = [e.data["id"] for e in events]
    assert len(ids) == len(set(ids)), f"an event seen twice: {ids}"
    chunks = [e for e in events if e.kind == "chunk"]
    at_reply = next(t for t, e in seen if e.kind == "reply")
    first_chunk = next(t for t, e in seen if e.kind == "chunk")
    assert at_reply - first_chunk > 0.5, "the text arrived while the model wrote it, well before the reply"
    assert max(e.offset for e in chunks) < next(e.offset for e in events if e.kind == "reply")
    calls = sorted({(e.data["data"]["dispatch"], e.data["data"]["attempt"]) for e in chunks})
    assert len(calls) == 2, f"the cut call and its retry each streamed: {calls}"
    cut, winner = calls
    partial = "".join(e.data["data"]["text"] for e in chunks
                      if (e.data["data"]["dispatch"], e.data["data"]["attempt"]) == cut)
    assert partial and TEXT.startswith(partial) and partial != TEXT
    won = [e.data["data"] for e in chunks if (e.data["data"]["dispatch"], e.data["data"]["attempt"]) == winner]
    assert [d["seq"] for d in won] == list(range(len(won))) and len(won) > 1
    assert "".join(d["text"] for d in won) == reply["text"]
    folded = StreamedText()
    for e in events:
        folded.add(e)
    assert folded.text(reply["round"], 0) == reply["text"]
