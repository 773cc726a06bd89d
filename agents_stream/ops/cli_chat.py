"""``agents-stream chat <agent>``: a conversation in the terminal. Each line typed is a message; what the agent does
(its text as the model writes it, its tool calls, results, waits for approval, a handoff to a person and back) is
printed as it happens, then its reply (a person's marked as such). Ctrl-D ends the chat.

It talks to a worker's conversation API (agents_stream.client) at AGENTS_STREAM_PUBLIC_URL, else WEB_HOST and
WEB_PORT, with AGENTS_STREAM_API_TOKEN. Every text that came from the model, a tool or another person is printed
with its control characters escaped (``printable``): a reply cannot rewrite the terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import uuid
from typing import Any, TextIO

from agents_stream.client import Client, ClientError, Event, StreamedText
from agents_stream.ops.cli_common import AddParser, operator_token, printable
from agents_stream.settings import Settings

__all__ = ["register"]


def register(add_parser: AddParser) -> None:
    chat = add_parser("chat", help="talk to an agent in a conversation: each line is a message")
    chat.add_argument("agent", help="the agent to talk to")
    chat.add_argument("--conversation", help="go on with this conversation (default: a new one)")
    chat.add_argument("--user", help="who you are, as the agent is told")
    chat.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each reply (300)")
    chat.set_defaults(func=_cmd_chat)


def _cmd_chat(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    try:
        return asyncio.run(chat(settings, args.agent, args.conversation or f"chat-{uuid.uuid4().hex[:12]}",
                                user=args.user, timeout=args.timeout))
    except KeyboardInterrupt:
        return 130


async def chat(
    settings: Settings, agent: str, conversation_id: str, *, user: str | None = None, timeout: float = 300.0,
    out: TextIO = sys.stdout,
) -> int:
    """The chat loop: a line in, its events and reply out, until the input ends."""
    lines = _lines()
    say = _printer(out)
    say(f"conversation {printable(conversation_id)} with {printable(agent)} at {settings.link_base()} "
        "(Ctrl-D ends it)")
    after: int | None = None
    async with Client(settings.link_base(), operator_token(settings, write=True) or None) as client:
        while True:
            say("you> ", end="")
            text = await lines.get()
            if text is None:
                say("")
                return 0
            if not text.strip():
                continue
            try:
                sent = await client.send(conversation_id, agent, text, user=user)
                after = await _follow(client, conversation_id, sent.message_id, after, timeout, say)
            except ClientError as exc:
                say(f"! {printable(str(exc))}")
                if exc.status in (401, 403, 404):
                    return 1


async def _follow(
    client: Client, conversation_id: str, message_id: str, after: int | None, timeout: float, say: Any,
) -> int | None:
    """Print the events that follow the message until its reply; the last event's offset (to resume after)."""
    mine = after is not None  # a stream from the start shows earlier rounds too: print from this message on
    text = _Text(say)
    async for event in client.events(conversation_id, after=after, timeout=timeout):
        after = event.offset
        if not mine:
            mine = event.data.get("id") == f"message:{message_id}"
            continue
        if text.chunk(event):
            continue
        line = _render(event)
        reply = event.kind == "reply"
        if reply and text.shown(event):  # its text was printed as it was written: the line just ends
            line = None if event.data["data"].get("status") == "succeeded" else line
        text.end()
        if line:
            say(line)
        if reply and message_id in event.data["data"].get("message_ids", []):
            return after
    raise ClientError(0, f"no reply within {timeout:g}s; it comes later: go on with --conversation "
                         f"{conversation_id}")


def _render(event: Event) -> str | None:
    data = event.data.get("data") or {}
    match event.kind:
        case "turn":
            calls = ", ".join(f"{c.get('name')}({json.dumps(c.get('arguments'), ensure_ascii=False)})"
                              for c in data.get("tool_calls") or [])
            return f"  · {printable(calls)}" if calls else None
        case "tool_result":
            mark = "✗" if data.get("error") else "✓"
            return f"  {mark} {printable(str(data.get('name')))}: {printable(str(data.get('content'))[:200])}"
        case "waiting_for_approval":
            return "  … waiting for a person to approve"
        case "decision":
            return f"  {printable(str(data.get('decision')))} by {printable(str(data.get('by')))}"
        case "summary" if data.get("error"):
            return f"  (the earlier messages could not be summarised: {printable(str(data['error']))[:200]})"
        case "summary":
            return (f"  (earlier messages summarised: {data.get('chars')} characters, covering the first "
                    f"{data.get('until')} history items)")
        case "routed":
            return (f"  → {printable(str(data.get('handler')))} ({printable(str(data.get('by')))}: "
                    f"{printable(str(data.get('reason')))[:200]})")
        case "escalated":
            return (f"  ↑ {printable(str(data.get('from')))} → {printable(str(data.get('to')))}: "
                    f"{printable(str(data.get('reason')))[:200]}")
        case "dispatched" if data.get("attempt", 1) > 1:
            return f"  (taken over: attempt {data['attempt']})"
        case "handed_over":
            return (f"  ⇢ handed to a person ({printable(str(data.get('source')))}: "
                    f"{printable(str(data.get('reason')))[:200]})")
        case "taken":
            return f"  ⇢ {printable(str(data.get('by')))} took it"
        case "handoff_escalated" if data.get("to") is None:
            return "  ⇢ still waiting for a person: every level's time ran out, it stays in the inbox"
        case "handoff_escalated":
            level = f"level {int(data.get('to') or 0) + 1} ({printable(str(data.get('level_name')))})"
            return f"  ⇢ still waiting for a person: {level} asked"
        case "handed_back":
            return f"  ⇠ handed back to the agent by {printable(str(data.get('by')))}"
        case "reply" if data.get("human"):
            return f"{printable(str(data.get('operator')))} (a person)> " + _printable_lines(str(data.get("text")))
        case "reply":
            status = data.get("status")
            prefix = "agent> " if status == "succeeded" else f"agent ({printable(str(status))})> "
            return prefix + _printable_lines(str(data.get("text")))
    return None


class _Text:
    """The model's text printed as its chunks come: one open line per call, begun again when a later call (a retry,
    a fallback, a takeover) supersedes what was printed."""

    def __init__(self, say: Any) -> None:
        self._say = say
        self._streamed = StreamedText()
        self._open = False
        self._last: tuple[int, int] | None = None  # the round and turn printed last

    def chunk(self, event: Event) -> bool:
        if event.kind != "chunk":
            return False
        change = self._streamed.add(event)
        if change is None:
            return True
        if change.restart:
            if self._open and self._last == (change.round, change.turn):
                self._say("\n  (that call failed; the agent writes again)")
            elif self._open:
                self._say("")
            self._say("agent> ", end="")
            self._open, self._last = True, (change.round, change.turn)
        self._say(_printable_lines(change.text), end="")
        return True

    def shown(self, reply: Event) -> bool:
        """The reply's text is what was printed last as it was written."""
        if self._last is None or reply.data.get("round") != self._last[0]:
            return False
        return bool(self._streamed.text(*self._last)) and self._streamed.text(*self._last) == str(
            (reply.data.get("data") or {}).get("text"))

    def end(self) -> None:
        if self._open:
            self._say("")
            self._open = False


def _printable_lines(text: str) -> str:
    return "\n".join(printable(line) for line in text.split("\n"))


def _printer(out: TextIO) -> Any:
    def say(text: str, end: str = "\n") -> None:
        out.write(text + end)
        out.flush()

    return say


def _lines() -> asyncio.Queue[str | None]:
    """Lines of standard input as they are typed (None at its end), read by a daemon thread: a blocked read never
    holds the process at exit."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | None] = asyncio.Queue()

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(queue.put_nowait, line.rstrip("\n"))
        loop.call_soon_threadsafe(queue.put_nowait, None)

    threading.Thread(target=read, name="chat-input", daemon=True).start()
    return queue
