"""A round's model text on its way: chunk events sent to ``agent.conversation.events`` as the provider writes it.

Only rounds of conversations stream (a task's caller reads its result). Chunks are ephemeral: sent once, never
journaled, in no table, never retried, so a chunk lost to a broker hiccup is simply not shown; the durable ``turn``
event and the reply carry the whole text. Each names its round, the loop's turn, the dispatch and the call
(``attempt``: the run's call number, unique within a dispatch) and its ``seq`` within that call, so a client drops
the text of a call that another one replaced (a retry, a fallback to the next rung, a takeover after a crash).
Pieces are batched (a chunk is sent ``flush_s`` after its first piece, or once it holds ``chunk_chars``), so a token
is not a Kafka record; a call streams at most ``max_chars`` (then a last chunk says ``cut``). A send that fails is
logged once and the call goes on: a chunk never fails a model call. Schema: docs/conversations.md, "Events".
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from agents_stream.contract import topics
from agents_stream.contract.conversation_messages import round_of
from agents_stream.contract.models import SCHEMA_VERSION, utcnow_iso

__all__ = ["CHUNK_CHARS", "FLUSH_S", "MAX_CHARS", "ChunkStream", "Chunks", "SendEvent"]

log = logging.getLogger(__name__)

#: send one record (key, value, partition) without waiting; a future of the broker's answer, or None
SendEvent = Callable[[bytes, bytes, int], Any]

#: a chunk is sent at most this long after its first piece arrived
FLUSH_S = 0.08
#: the most text one chunk carries
CHUNK_CHARS = 1000
#: the most text one call streams; the rest is only in the turn event and the reply
MAX_CHARS = 64_000


class Chunks:
    """The worker's sender of chunk events (one per executor)."""

    def __init__(
        self, send: SendEvent, partitions: int, *, flush_s: float = FLUSH_S, chunk_chars: int = CHUNK_CHARS,
        max_chars: int = MAX_CHARS,
    ) -> None:
        self._send = send
        self.partitions = partitions
        self.flush_s = flush_s
        self.chunk_chars = chunk_chars
        self.max_chars = max_chars
        self._failing = False  # a send failed and was logged: the next failures are not, until one succeeds

    def streams(self, task_id: str) -> bool:
        """Whether a task's calls stream (it is a round of a conversation)."""
        return round_of(task_id) is not None

    def open(self, task_id: str, dispatch: int, attempt: int, turn: int) -> ChunkStream | None:
        """The stream of one call (``attempt``: the run's call number) of turn ``turn``; None for a task that is
        not a round."""
        found = round_of(task_id)
        if found is None:
            return None
        conversation_id, _, number = found
        return ChunkStream(self, conversation_id, number, dispatch, attempt, turn)

    def send(self, conversation_id: str, event: dict[str, Any]) -> None:
        """One chunk event, keyed by its conversation on its partition; never raises."""
        key = conversation_id.encode("utf-8")
        body = {"schema_version": SCHEMA_VERSION, "conversation_id": conversation_id, **event, "at": utcnow_iso()}
        try:
            value = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
            sent = self._send(key, value, topics.partition_for(key, self.partitions))
        except Exception as exc:  # noqa: BLE001 (a chunk never fails the call)
            self._failed(exc)
            return
        if isinstance(sent, asyncio.Future):
            sent.add_done_callback(self._answered)

    def _answered(self, sent: asyncio.Future[Any]) -> None:
        if sent.cancelled():
            return
        if sent.exception() is not None:
            self._failed(sent.exception())
        elif self._failing:
            self._failing = False
            log.info("Streamed text reaches %s again", topics.CONVERSATION_EVENTS)

    def _failed(self, exc: BaseException | None) -> None:
        if not self._failing:
            self._failing = True
            log.warning("A chunk of streamed text could not be sent to %s (%r): the model calls go on, their text "
                        "arrives with the turn and the reply", topics.CONVERSATION_EVENTS, exc)


class ChunkStream:
    """The text of one call, batched into chunk events. ``write`` is the provider's TextSink: it never raises."""

    def __init__(self, chunks: Chunks, conversation_id: str, number: int, dispatch: int, attempt: int,
                 turn: int) -> None:
        self._chunks = chunks
        self.conversation_id = conversation_id
        self.round = number
        self.dispatch = dispatch
        self.attempt = attempt
        self.turn = turn
        self.seq = 0
        self.streamed = 0  # characters taken (at most max_chars)
        self.cut = False
        self._buffer: list[str] = []
        self._buffered = 0
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    def write(self, text: str) -> None:
        try:
            self._write(text)
        except Exception:  # noqa: BLE001 (a chunk never fails the call)
            log.exception("Streaming a piece of text of round %d failed; the call goes on", self.round)

    def _write(self, text: str) -> None:
        if self._closed or self.cut or not text:
            return
        room = self._chunks.max_chars - self.streamed
        if len(text) >= room:
            text, self.cut = text[:room], True
        self.streamed += len(text)
        self._buffer.append(text)
        self._buffered += len(text)
        if self.cut or self._buffered >= self._chunks.chunk_chars:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._chunks.flush_s, self.flush)

    def flush(self) -> None:
        """Send what is buffered now (in chunks of at most ``chunk_chars``)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        text, self._buffer, self._buffered = "".join(self._buffer), [], 0
        size = self._chunks.chunk_chars
        for start in range(0, len(text), size):
            last = start + size >= len(text)
            self._send(text[start:start + size], cut=self.cut and last)

    def close(self) -> None:
        """The call ended (answered or failed): the rest is sent, later pieces are ignored."""
        if not self._closed:
            self.flush()
            self._closed = True

    def _send(self, text: str, *, cut: bool) -> None:
        event_id = f"round:{self.round}:chunk:{self.dispatch}:{self.attempt}:{self.seq}"
        data = {"turn": self.turn, "dispatch": self.dispatch, "attempt": self.attempt, "seq": self.seq, "text": text,
                "cut": cut}
        self.seq += 1
        self._chunks.send(self.conversation_id, {"id": event_id, "kind": "chunk", "round": self.round, "data": data})
