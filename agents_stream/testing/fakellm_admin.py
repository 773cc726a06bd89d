"""The fake LLM's admin endpoints (``/_admin/*``): its modes, script, requests and stats, from another process."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from aiohttp import web

from agents_stream.testing.script import Reply, validate_mode

if TYPE_CHECKING:
    from agents_stream.testing.server import FakeLLM

__all__ = ["admin_routes"]

#: how long a request's body may take to arrive
_READ_TIMEOUT_S = 5.0


def admin_routes(fake: FakeLLM) -> list[web.RouteDef]:
    """The routes that script ``fake`` over HTTP: GET/POST mode, GET requests and stats, POST script and reset."""

    async def get_mode(request: web.Request) -> web.Response:
        return web.json_response({**asdict(fake.mode), "seed": fake.seed})

    async def set_mode(request: web.Request) -> web.StreamResponse:
        try:
            changes = validate_mode(await _json_object(request))
        except ValueError as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None
        mode = {**asdict(fake.mode), **changes}
        mode.pop("outage_for", None)
        # answer before applying: outage="refuse" closes this very connection
        response = web.json_response(mode)
        await response.prepare(request)
        await response.write_eof()
        fake.set_mode(**changes)
        return response

    async def requests(request: web.Request) -> web.Response:
        return web.json_response([r.as_dict() for r in fake.requests])

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(fake.stats())

    async def script(request: web.Request) -> web.Response:
        data = await _json_object(request)
        unknown = set(data) - {"replies", "replace"}
        if unknown or not isinstance(data.get("replies", []), list):
            raise web.HTTPBadRequest(text='the body is {"replies": [...], "replace": false}')
        try:
            replies = [Reply.from_dict(r) for r in data.get("replies", [])]
        except (TypeError, ValueError) as exc:
            raise web.HTTPBadRequest(text=f"bad reply: {exc}") from None
        # "replace": the replies left are dropped; otherwise the new ones come after them
        fake.enqueue(*replies, replace=bool(data.get("replace")))
        return web.json_response({"script_remaining": fake.stats()["script_remaining"]})

    async def reset(request: web.Request) -> web.Response:
        fake.reset()
        return web.json_response({"reset": True})

    return [
        web.get("/_admin/mode", get_mode),
        web.post("/_admin/mode", set_mode),
        web.get("/_admin/requests", requests),
        web.get("/_admin/stats", stats),
        web.post("/_admin/script", script),
        web.post("/_admin/reset", reset),
    ]


async def _json_object(request: web.Request) -> dict[str, Any]:
    try:
        data = json.loads(await asyncio.wait_for(request.read(), _READ_TIMEOUT_S) or b"{}")
    except ValueError:
        raise web.HTTPBadRequest(text="body must be a JSON object") from None
    if not isinstance(data, dict):
        raise web.HTTPBadRequest(text="body must be a JSON object")
    return data
