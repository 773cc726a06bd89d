"""A request's JSON body: read whole up to a cap (across TCP segments and chunks), no deeper than a bound."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents_stream.ops.access import Refused, conversation_access, may_write, same_origin
from agents_stream.settings import Settings

__all__ = ["BODY_TIMEOUT_S", "MAX_BODY", "MAX_DEPTH", "json_depth", "mutation_body", "parse_json", "read_body"]

MAX_BODY = 64 * 1024
#: arrays and objects inside each other; no endpoint's body needs more than a few
MAX_DEPTH = 32
#: how long a client may take to send its body (a slow sender holds one connection, not the loop)
BODY_TIMEOUT_S = 10.0


async def read_body(content: Any, cap: int = MAX_BODY, timeout: float = BODY_TIMEOUT_S) -> bytes:
    """Every byte of the body (an aiohttp StreamReader), however it was split; Refused 413 past ``cap``, 408 when
    it does not arrive within ``timeout``. ``read(n)`` alone returns what has arrived so far: one segment."""

    async def whole() -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = await content.read(cap + 1 - size)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > cap:
                raise Refused(413, f"request body over {cap} bytes")
            chunks.append(chunk)

    try:
        return await asyncio.wait_for(whole(), timeout)
    except asyncio.TimeoutError:
        raise Refused(408, f"the request body did not arrive within {timeout:g}s") from None


def json_depth(raw: bytes) -> int:
    """How deeply arrays and objects nest in ``raw`` (brackets inside strings do not count), without parsing."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def parse_json(raw: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value of ``raw``; Refused 400 for text that is not JSON or nests deeper than ``max_depth``
    (json.loads would recurse until RecursionError, a 500)."""
    if json_depth(raw) > max_depth:
        raise Refused(400, f"the body nests arrays/objects deeper than {max_depth} levels")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise Refused(400, f"the body is not JSON: {exc}") from None


async def mutation_body(settings: Settings, request: Any) -> dict[str, Any]:
    """The checks every mutating endpoint makes, in order; raises Refused with the status and what to do."""
    if not same_origin(request):
        raise Refused(
            403,
            "cross-origin request refused: use the console served by this worker, the CLI, or a client without an "
            "Origin header",
        )
    if not (may_write(settings, request.headers.get("Authorization", ""))
            or conversation_access(settings, request, write=True)):
        raise Refused(401, "a bearer token is required (Authorization: Bearer <AGENTS_STREAM_API_TOKEN>)")
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise Refused(413, f"request body over {MAX_BODY} bytes")
    raw = await read_body(request.content)
    if not raw.strip():
        return {}
    if request.content_type != "application/json":
        raise Refused(415, "send the body as JSON with Content-Type: application/json")
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise Refused(400, "the body must be a JSON object")
    return body
