"""Reads across the workers of one app id: forwarded to the worker owning a key, or gathered from all of them."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from faust.web import Request, Response, View

from agents_stream.contract import topics
from agents_stream.ops.access import Refused

#: set on a forwarded or gathering request: the worker asked answers itself, never forwards again
ROUTED_HEADER = "X-Agents-Stream-Routed"


def forwarded_headers(request: Any) -> dict[str, str]:
    """What a forwarded or gathering request carries: the routing mark and the caller's own credential (the
    other worker checks it again; no worker lends its own)."""
    headers = {ROUTED_HEADER: "1"}
    if request.headers.get("Authorization"):
        headers["Authorization"] = request.headers["Authorization"]
    return headers


async def gather(app: Any, path: str, headers: dict[str, str]) -> tuple[list[Any], list[str]]:
    """``path`` as answered by every other worker of the group (bodies, and the workers that did not answer);
    ``headers``: ``forwarded_headers(request)``."""
    here = str(app.conf.canonical_url).rstrip("/")
    urls = {str(u).rstrip("/") for u in app.router.tables_metadata()} - {here}

    async def one(url: str) -> Any:
        timeout = aiohttp.ClientTimeout(total=5)
        async with app.http_client.get(url + path, headers=headers, timeout=timeout) as resp:
            resp.raise_for_status()
            return await resp.json()

    answers = await asyncio.gather(*(one(u) for u in sorted(urls)), return_exceptions=True)
    bodies = [a for a in answers if not isinstance(a, BaseException)]
    missing = [u for u, a in zip(sorted(urls), answers, strict=True) if isinstance(a, BaseException)]
    return bodies, missing


def active_partitions(app: Any, table: Any) -> set[int]:
    """The partitions of ``table`` this worker owns now (not its standby copies, which may be behind)."""
    here = str(app.conf.canonical_url).rstrip("/")
    changelog = table.changelog_topic.get_topic_name()
    return {p for url, assigned in app.router.tables_metadata().items() if str(url).rstrip("/") == here
            for p in assigned.get(changelog, ())}


def owner_of(app: Any, table: Any, key: str, partitions: int) -> str | None:
    """The web URL of the worker whose active partitions hold ``key`` in ``table``; None during a rebalance.

    Faust's own ``table_route`` hashes the key as the changelog serializes it
    (JSON, with quotes), not as our topics are keyed (raw task_id bytes), so it
    sends about half of all lookups to a worker that does not own the key.
    """
    partition = topics.partition_for(key.encode("utf-8"), partitions)
    changelog = table.changelog_topic.get_topic_name()
    for url, assigned in app.router.tables_metadata().items():
        if partition in assigned.get(changelog, ()):
            return str(url)
    return None


def owner_elsewhere(app: Any, table: Any, key: str, partitions: int, request: Any) -> str | None:
    """The web URL of the worker to ask about ``key``, or None when this worker answers itself: it owns the key,
    or another worker forwarded the request here (a forwarded request is never forwarded again). Refused (503)
    during a rebalance, when no worker owns the key's partition."""
    owner = owner_of(app, table, key, partitions)
    if owner is None:
        raise Refused(503, "partitions are being reassigned; retry in a few seconds")
    if owner.rstrip("/") == str(app.conf.canonical_url).rstrip("/") or request.headers.get(ROUTED_HEADER):
        return None
    return owner


async def ask_owner(
    app: Any, owner: str, request: Any, *, path: str | None = None, json: Any = None, timeout_s: float = 10.0,
    unanswered: str = "",
) -> tuple[int, str, bytes]:
    """The owner's answer to the request (its status, content type and body), forwarded with the caller's own
    credential: the same method and path unless ``path`` names another (a GET then), ``json`` as its body.
    Refused (502) when the owner does not answer; ``unanswered`` says what the caller should do then."""
    method = "GET" if path is not None else request.method
    url = owner.rstrip("/") + (path if path is not None else request.rel_url.raw_path_qs)
    try:
        async with app.http_client.request(method, url, json=json, headers=forwarded_headers(request),
                                           timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            return resp.status, resp.content_type, await resp.read()
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise Refused(502, f"the worker owning this key ({owner}) did not answer: {type(exc).__name__}"
                           + (f"; {unanswered}" if unanswered else "")) from None


def routed(app: Any, table: Any, param: str, partitions: int) -> Any:
    """Answer a read on the worker that owns the key, forwarding the request there when that is another worker."""

    def decorate(handler: Any) -> Any:
        async def view(self: View, request: Request, **kwargs: Any) -> Response:
            try:
                owner = owner_elsewhere(app, table, kwargs[param], partitions, request)
                if owner is not None:
                    status, content_type, body = await ask_owner(app, owner, request)
                    return self.bytes(body, content_type=content_type, status=status)
            except Refused as exc:
                return self.json({"error": str(exc)}, status=exc.status)
            return await handler(self, request, **kwargs)

        return view

    return decorate
