"""``GET /conversations/<id>/events``: a conversation's progress as Server-Sent Events, served by any worker.

Each stream reads the conversation's partition of ``agent.conversation.events`` with its own consumer (no group),
so it does not depend on the worker that runs the conversation: a kill of that worker does not end it. An
event's SSE ``id`` is its Kafka offset; a client that reconnects with ``Last-Event-ID`` (or ``?after=``) goes on
after it. Each event's own ``id`` (what happened, tables/conversation_events.py) is shown once per stream: a
copy the ledger sent again after a crash is skipped, also across a resume (the records up to ``LOOKBACK`` before
the resume point are read to learn what the client has seen). Schemas: docs/conversations.md, "Events".
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import aclosing, suppress
from typing import TYPE_CHECKING, Any, AsyncGenerator

from aiohttp import web
from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.web import Request, View

from agents_stream.contract import topics
from agents_stream.kafka import security as kafka_security
from agents_stream.settings import Settings, bootstrap_servers

if TYPE_CHECKING:
    from agents_stream.ops.web import Worker

__all__ = ["follow", "register_event_views"]

log = logging.getLogger(__name__)

#: streams one worker serves at once (each holds a consumer); past it, 503 and the client retries
MAX_STREAMS = 64
#: a stream ends after this long; the client reconnects with Last-Event-ID (EventSource does so itself)
STREAM_S = 600.0
#: a comment line sent when nothing happened for this long, so proxies keep the connection
KEEPALIVE_S = 15.0
#: records of the partition read before a resume point, to skip copies of events the client saw
LOOKBACK = 1000
#: how long the broker may take to start a stream's consumer
START_S = 15.0


async def follow(
    settings: Settings, conversation_id: str, after: int | None, *, until: float, poll_s: float = 1.0,
) -> AsyncGenerator[tuple[int, dict[str, Any]] | None, None]:
    """The conversation's events after offset ``after`` (from its first when None) as (offset, event), and None
    each ``poll_s`` without one, until the monotonic time ``until``."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers(settings.broker), group_id=None, enable_auto_commit=False,
        **kafka_security.client_kwargs(settings),
    )
    await asyncio.wait_for(consumer.start(), START_S)
    try:
        key = conversation_id.encode("utf-8")
        tp = TopicPartition(topics.CONVERSATION_EVENTS, topics.partition_for(key, settings.partitions))
        consumer.assign([tp])
        begin = (await asyncio.wait_for(consumer.beginning_offsets([tp]), START_S))[tp]
        consumer.seek(tp, begin if after is None else max(begin, after + 1 - LOOKBACK))
        seen: set[str] = set()
        while time.monotonic() < until:
            batch = await consumer.getmany(tp, timeout_ms=int(poll_s * 1000))
            sent = False
            for record in batch.get(tp, ()):
                if record.key != key:
                    continue
                event = _decoded(record.value)
                if event is None or event["id"] in seen:
                    continue
                seen.add(event["id"])
                if event.get("kind") == "deleted":  # begun again under its id, it names its events anew
                    seen = {event["id"]}
                if after is None or record.offset > after:
                    sent = True
                    yield record.offset, event
            if not sent:
                yield None
    finally:
        await asyncio.wait_for(consumer.stop(), START_S)


def _decoded(value: bytes | None) -> dict[str, Any] | None:
    try:
        event = json.loads(value or b"")
    except (ValueError, UnicodeDecodeError):
        return None
    return event if isinstance(event, dict) and isinstance(event.get("id"), str) else None


def register_event_views(app: Any, runtime: Worker) -> None:
    settings = runtime.settings
    streams = [0]  # open now on this worker

    @app.page("/conversations/{conversation_id}/events")
    class Events(View):
        async def get(self, request: Request, conversation_id: str) -> Any:
            raw = request.headers.get("Last-Event-ID") or request.query.get("after")
            try:
                after = int(raw) if raw not in (None, "") else None
                if after is not None and after < -1:
                    raise ValueError(raw)
            except ValueError:
                return self.json({"error": f"Last-Event-ID / after must be an event id (an offset), not {raw!r}"},
                                 status=400)
            if streams[0] >= MAX_STREAMS:
                return self.json({"error": f"this worker serves {MAX_STREAMS} event streams already; retry, or ask "
                                           "another worker"}, status=503)
            streams[0] += 1
            try:
                return await _stream(request, settings, conversation_id, after)
            finally:
                streams[0] -= 1

    del Events


async def _stream(request: Any, settings: Settings, conversation_id: str, after: int | None) -> web.StreamResponse:
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no",
    })
    await response.prepare(request)
    quiet_since = time.monotonic()
    try:
        async with aclosing(follow(settings, conversation_id, after, until=time.monotonic() + STREAM_S)) as events:
            async for item in events:
                if item is None:
                    if time.monotonic() - quiet_since >= KEEPALIVE_S:
                        await response.write(b": keepalive\n\n")
                        quiet_since = time.monotonic()
                    continue
                offset, event = item
                data = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
                await response.write(f"id: {offset}\nevent: {event.get('kind', 'event')}\ndata: {data}\n\n".encode())
                quiet_since = time.monotonic()
    except (ConnectionResetError, asyncio.CancelledError):
        raise  # the client went away (aiohttp cancels the handler): aclosing stops the consumer
    except Exception as exc:  # the broker failed the stream: said in the stream, the client resumes
        log.warning("The event stream of conversation %s ended: %r; its client resumes with Last-Event-ID",
                    conversation_id, exc)
        with suppress(ConnectionResetError):
            await response.write(f"event: error\ndata: {json.dumps({'error': repr(exc)[:300]})}\n\n".encode())
    return response
