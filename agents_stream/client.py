"""A Python client of a worker's conversation API: send a message, read a conversation, await a reply.

    async with Client("http://127.0.0.1:6066", token="...") as client:
        sent = await client.send("c-42", "support", "my package never came, refund me")
        reply = await client.reply("c-42", sent.message_id, timeout=120)
        print(reply["text"])

Every call has a timeout. ``send`` returns once the broker has the message; sending it again with the same
``message_id`` (a retry after a timeout or a 503) is the same message and gets the same one reply. ``events``
follows the conversation live, the model's text included as it writes it (``chunk`` events); ``StreamedText``
puts those together, dropping the text of a call that a later one replaced. Schemas: docs/conversations.md.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator
from urllib.parse import quote

import aiohttp

__all__ = ["Client", "ClientError", "Event", "Sent", "StreamedText", "Streamed"]


class ClientError(Exception):
    """The worker refused a request (``status`` and its ``error``) or did not answer in time (status 0)."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(f"{status}: {error}" if status else error)
        self.status = status
        self.error = error


@dataclass(frozen=True)
class Sent:
    """A message the broker confirmed: where it is in its conversation's partition."""

    conversation_id: str
    message_id: str
    partition: int
    offset: int


@dataclass(frozen=True)
class Event:
    """One event of a conversation's stream: ``offset`` resumes the stream after it (Last-Event-ID); ``data`` has
    its ``id`` (what happened), ``kind``, ``run`` and ``data`` (docs/conversations.md, "Events")."""

    offset: int
    kind: str
    data: dict[str, Any]


@dataclass(frozen=True)
class Streamed:
    """What a chunk event changes: ``restart`` — a new call's text begins (what was shown of this turn before is
    superseded), then ``text`` is its first piece; else ``text`` follows what was shown."""

    round: int
    turn: int
    restart: bool
    text: str


class StreamedText:
    """The text each model turn of a conversation is being written, folded from its ``chunk`` events.

    Per round and turn, only the latest call counts (its ``dispatch`` and ``attempt``, compared in that order): a
    chunk of an earlier call comes from one that failed or was replaced (a retry, a fallback, a takeover) and is
    dropped; the first chunk of a later call starts the turn's text over. The durable ``turn`` and ``reply`` events
    carry the whole text; a chunk may be lost (chunks are not journaled), so they are what to keep.
    """

    def __init__(self) -> None:
        self._calls: dict[tuple[int, int], tuple[tuple[int, int], list[str]]] = {}

    def add(self, event: Event) -> Streamed | None:
        """The change a chunk event makes; None for any other event, or a chunk of a superseded call."""
        data = event.data.get("data") if event.kind == "chunk" else None
        if not isinstance(data, dict):
            return None
        try:
            key = (int(event.data["round"]), int(data["turn"]))
            call = (int(data["dispatch"]), int(data["attempt"]))
            text = str(data["text"])
        except (KeyError, TypeError, ValueError):
            return None
        current = self._calls.get(key)
        if current is not None and call < current[0]:
            return None
        restart = current is None or call > current[0]
        if restart:
            self._calls[key] = (call, [text])
        else:
            self._calls[key][1].append(text)
        return Streamed(key[0], key[1], restart, text)

    def text(self, round: int, turn: int) -> str:
        """What the latest call of a round's turn wrote so far."""
        current = self._calls.get((round, turn))
        return "".join(current[1]) if current is not None else ""


class Client:
    """One worker's conversation API (any worker of the app answers for every conversation)."""

    def __init__(self, url: str, token: str | None = None, *, timeout_s: float = 20.0) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        self._session = aiohttp.ClientSession(headers=self.headers, timeout=self.timeout)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("use the client as `async with Client(...) as client:`")
        return self._session

    async def send(
        self, conversation_id: str, agent: str, text: str, *, message_id: str | None = None,
        context_data: dict[str, Any] | None = None, user: str | None = None,
    ) -> Sent:
        """Post a message; returns once the broker confirmed it (ClientError otherwise: retry with the same id)."""
        body: dict[str, Any] = {"message_id": message_id or uuid.uuid4().hex, "agent_name": agent, "text": text}
        if context_data:
            body["context_data"] = context_data
        if user is not None:
            body["user"] = user
        answer = await self._request("POST", f"/conversations/{_quote(conversation_id)}/messages", body)
        return Sent(conversation_id, answer["message_id"], answer["partition"], answer["offset"])

    async def conversation(self, conversation_id: str) -> dict[str, Any] | None:
        """The conversation's status, messages and replies; None when no message of it was recorded yet."""
        try:
            return await self._request("GET", f"/conversations/{_quote(conversation_id)}")
        except ClientError as exc:
            if exc.status == 404:
                return None
            raise

    async def reply(
        self, conversation_id: str, message_id: str, *, timeout: float = 120.0, every: float = 0.25,
    ) -> dict[str, Any]:
        """The reply that answers ``message_id``, once there is one (ClientError after ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        path = f"/conversations/{_quote(conversation_id)}/messages/{_quote(message_id)}"
        while True:
            try:
                found = await self._request("GET", path)
            except ClientError as exc:
                if exc.status not in (0, 404, 502, 503):  # not recorded yet, a rebalance, a worker restarting
                    raise
                found = None
            if found and found.get("reply"):
                return dict(found["reply"])
            if time.monotonic() >= deadline:
                raise ClientError(0, f"no reply to message {message_id} of {conversation_id} within {timeout:g}s")
            await asyncio.sleep(every)

    async def events(
        self, conversation_id: str, *, after: int | None = None, timeout: float = 120.0,
    ) -> AsyncIterator[Event]:
        """The conversation's events after offset ``after`` (all of them when None), as they happen, until the
        worker ends the stream or ``timeout`` seconds pass. Resume with the last event's offset; a worker that
        died ends the stream (ClientError): ask any other worker, or the same once it is back."""
        headers = {"Last-Event-ID": str(after)} if after is not None else {}
        url = f"{self.url}/conversations/{_quote(conversation_id)}/events"
        stream_timeout = aiohttp.ClientTimeout(total=timeout, sock_read=60)
        try:
            async with self.session.get(url, headers=headers, timeout=stream_timeout) as resp:
                if resp.status >= 400:
                    data = await resp.json(content_type=None)
                    raise ClientError(resp.status, (data or {}).get("error", resp.reason or ""))
                fields: dict[str, str] = {}
                async for raw in resp.content:
                    line = raw.decode("utf-8").rstrip("\r\n")
                    if line:
                        if not line.startswith(":"):
                            name, _, value = line.partition(":")
                            fields[name] = value[1:] if value.startswith(" ") else value
                        continue
                    if "data" in fields and "id" in fields:
                        yield Event(int(fields["id"]), fields.get("event", "event"), json.loads(fields["data"]))
                    fields = {}
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise ClientError(0, f"the event stream of {conversation_id} ended ({type(exc).__name__})") from None

    async def _request(self, method: str, path: str, body: Any = None) -> Any:
        try:
            async with self.session.request(method, self.url + path, json=body) as resp:
                data = await resp.json(content_type=None)
                if resp.status >= 400:
                    raise ClientError(resp.status, (data or {}).get("error", resp.reason or ""))
                return data
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise ClientError(0, f"{method} {path}: no answer from {self.url} ({type(exc).__name__})") from None


def _quote(value: str) -> str:
    return quote(value, safe="")
