"""Reads across the workers of one app id: forwarded to the worker owning a key, or gathered from all of them."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from faust.web import Request, Response, View

from agents_stream.contract import topics

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


def routed(app: Any, table: Any, param: str, partitions: int) -> Any:
    """Answer a read on the worker that owns the key, forwarding the request there when that is another worker."""

    def decorate(handler: Any) -> Any:
        async def view(self: View, request: Request, **kwargs: Any) -> Response:
            owner = owner_of(app, table, kwargs[param], partitions)
            here = str(app.conf.canonical_url).rstrip("/")
            if owner is None:
                return self.json({"error": "partitions are being reassigned; retry in a few seconds"}, status=503)
            if owner.rstrip("/") == here or request.headers.get(ROUTED_HEADER):
                return await handler(self, request, **kwargs)
            url = owner.rstrip("/") + request.rel_url.raw_path_qs
            try:
                timeout = aiohttp.ClientTimeout(total=10)
                async with app.http_client.get(url, headers=forwarded_headers(request), timeout=timeout) as resp:
                    return self.bytes(await resp.read(), content_type=resp.content_type, status=resp.status)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                error = f"the worker owning this key ({owner}) did not answer: {type(exc).__name__}"
                return self.json({"error": error}, status=502)

        return view

    return decorate
