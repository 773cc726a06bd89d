"""A long conversation on the real broker: 1,000 messages, each answered after a tool call that returns 100 KB
(100 MB of tool output in all), moved to another worker half-way. Every message has one reply, and the model is
sent as much at message 1,000 as at message 10: the history it sees is bounded by the agent's context policy,
and the conversation's own records do not grow (docs/conversations.md)."""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from agents_stream.client import Client
from agents_stream.contract.conversation_messages import round_task_id
from agents_stream.testing.fakellm import call, ok, tool_calls
from agents_stream.testing.script import Reply

from .harness import PARTITIONS, read_topic, unique
from .test_conversations import TOKEN, _one_distinct_reply_per_message

MESSAGES = 1000
TOOL_KB = 100
HISTORY = 20


def _answer(record: Any, turns: int) -> Reply:
    """Each round: read the log first, then answer (the round's number in the answer)."""
    messages = (record.body or {}).get("messages") or []
    if messages and messages[-1].get("role") == "tool":
        return ok(f"served fine ({record.task_id})")
    return tool_calls(call("read_log", {"kb": TOOL_KB}))


async def test_a_thousand_message_conversation_with_100_mb_of_tool_output_moves_workers_and_goes_on(
    cluster_factory, fake_llm,
):
    fake_llm.responder = _answer
    agent = unique("logs")
    toml = (f'[providers.fake]\nkind = "openai"\nbase_url = "{fake_llm.url}/v1"\nmodel = "fake-model"\n'
            f'timeout_s = 10\n\n[agents.{agent}]\nproviders = ["fake"]\n'
            f'agent = "agents_stream.testing.log_agent:LOGS"\nhistory_messages = {HISTORY}\n')
    c = cluster_factory([agent], None, toml=toml, AGENTS_STREAM_API_TOKEN=TOKEN)
    first = await c.started("a")
    cid = unique("long")
    latency: dict[int, float] = {}
    url = f"http://127.0.0.1:{first.web_port}"
    moved_at = MESSAGES // 2
    since = -1
    for n in range(1, MESSAGES + 1):
        if n == moved_at:  # a second worker joins, the first stops: the conversation moves to the second
            second = await c.started("b")
            code, _ = first.terminate()
            assert code == 0
            url = f"http://127.0.0.1:{second.web_port}"
        async with Client(url, TOKEN) as client:
            started = time.monotonic()
            sent = await client.send(cid, agent, f"how was the service at hour {n}?", message_id=f"m{n}")
            since = sent.offset if n == 1 else since
            reply = await client.reply(cid, sent.message_id, timeout=120, every=0.01)
            latency[n] = time.monotonic() - started
        assert reply["status"] == "succeeded" and reply["round"] == n, json.dumps(reply)
    asked = {}
    for r in fake_llm.requests:
        if r.task_id and r.task_id.startswith("conv:"):
            n = int(r.task_id.split("#")[-1].split(".")[0])
            asked.setdefault(n, []).append(len(json.dumps(r.body)))
    early = max(max(asked[n]) for n in range(10, 20))
    late = max(max(asked[n]) for n in range(MESSAGES - 10, MESSAGES + 1))
    last = [r for r in fake_llm.requests if r.task_id == round_task_id(cid, MESSAGES, PARTITIONS, since)][0]
    said = [m for m in last.body["messages"] if m["role"] in ("user", "assistant")]
    print(f"\nconversation: {MESSAGES} messages; latency p50 {statistics.median(latency.values()) * 1000:.0f} ms, "
          f"message 1 {latency[1] * 1000:.0f} ms, 100 {latency[100] * 1000:.0f} ms, 1000 "
          f"{latency[MESSAGES] * 1000:.0f} ms; model request bytes at messages 10-19 ≤ {early}, at the last 10 ≤ "
          f"{late}")
    assert len(said) == HISTORY + 1, "the model sees the context policy's 20 items and the new message"
    assert late < 1.2 * early, (early, late)
    replies = await read_topic("agent.replies", until=lambda seen: len(seen) >= MESSAGES, timeout=60,
                               keep=lambda m: m.key is not None and m.key.decode() == cid)
    answered = _one_distinct_reply_per_message([json.loads(m.value) for m in replies])
    assert set(answered) == {f"m{n}" for n in range(1, MESSAGES + 1)}
