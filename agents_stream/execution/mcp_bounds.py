"""How much of an MCP server's answer is read: at most ``max_message_bytes`` of one message, counted as it arrives.

The SDK reads a call's JSON response whole (``response.aread()``) and decodes it before anything looks at its size;
the agent loop's ``tool_result_max_bytes`` came only after that, so a server answering with gigabytes had the
worker hold and parse them all. Here the HTTP client's transport counts the bytes of every body that is not an SSE
stream and stops reading past the limit, with an ``httpx2.StreamError`` the SDK turns into that call's error (the
model is told, the server's breaker counts it); SSE events are bounded by the SDK's own ``max_sse_event_size``,
given the same limit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx2

__all__ = ["MessageTooLarge", "bounded_transport"]


class MessageTooLarge(httpx2.StreamError):
    """A server's message past ``max_message_bytes``: not read on."""


class _BoundedBody(httpx2.AsyncByteStream):
    def __init__(self, body: Any, limit: int) -> None:
        self._body = body
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = 0
        async for chunk in self._body:
            read += len(chunk)
            if read > self._limit:
                await self._body.aclose()
                raise MessageTooLarge(
                    f"the server's message is larger than max_message_bytes ({self._limit} bytes); not read on"
                )
            yield chunk

    async def aclose(self) -> None:
        await self._body.aclose()


class _BoundedTransport(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.headers.get("content-type", "").lower().startswith("text/event-stream"):
            return response  # a stream of messages: each event bounded by the SDK (max_sse_event_size)
        response.stream = _BoundedBody(response.stream, self._limit)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def bounded_transport(inner: httpx2.AsyncBaseTransport, limit: int) -> httpx2.AsyncBaseTransport:
    """``inner`` with every non-SSE response body read to at most ``limit`` bytes."""
    return _BoundedTransport(inner, limit)
