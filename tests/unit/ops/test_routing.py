"""Asking the worker that owns a key (agents_stream.ops.routing): who answers, what the owner is sent, and what a
caller is told when the owner does not answer — against a real aiohttp server standing in for the owner."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

import aiohttp
import pytest
from aiohttp import web

from agents_stream.contract import topics
from agents_stream.ops.access import Refused
from agents_stream.ops.routing import ROUTED_HEADER, ask_owner, owner_elsewhere

PARTITIONS = 4


@dataclass(frozen=True)
class RelUrl:
    raw_path_qs: str


@dataclass(frozen=True)
class Request:
    """What the helpers read of a faust.web request."""

    method: str
    headers: dict[str, str]
    rel_url: RelUrl


def request(method: str = "GET", path: str = "/tasks/t-1?x=1", **headers: str) -> Request:
    return Request(method=method, headers=headers, rel_url=RelUrl(path))


@dataclass(frozen=True)
class ChangelogTopic:
    name: str

    def get_topic_name(self) -> str:
        return self.name


@dataclass(frozen=True)
class Table:
    """What the helpers read of a table: its changelog topic's name."""

    changelog_topic: ChangelogTopic


@dataclass(frozen=True)
class Conf:
    canonical_url: str


@dataclass(frozen=True)
class Router:
    tables_metadata: Callable[[], dict[str, dict[str, list[int]]]]


@dataclass(frozen=True)
class App:
    """What the helpers read of the Faust app: its URL, its HTTP client, and who owns which changelog partitions."""

    conf: Conf
    http_client: Any
    router: Router


def app_with(owners: dict[str, list[int]], here: str, http: Any = None) -> tuple[App, Table]:
    table = Table(ChangelogTopic("app-tasks-changelog"))
    metadata = {url: {"app-tasks-changelog": parts} for url, parts in owners.items()}
    return App(Conf(here), http, Router(lambda: metadata)), table


def test_the_owner_is_asked_unless_this_worker_owns_the_key_or_was_asked_by_another() -> None:
    home = topics.partition_for(b"t-1", PARTITIONS)
    others = [p for p in range(PARTITIONS) if p != home]
    app, table = app_with({"http://a:1/": [home], "http://b:2": others}, "http://b:2")
    assert owner_elsewhere(app, table, "t-1", PARTITIONS, request()) == "http://a:1/"
    assert owner_elsewhere(app, table, "t-1", PARTITIONS, request(**{ROUTED_HEADER: "1"})) is None
    app, table = app_with({"http://a:1/": [home]}, "http://a:1")
    assert owner_elsewhere(app, table, "t-1", PARTITIONS, request()) is None
    app, table = app_with({"http://a:1/": others}, "http://a:1")
    with pytest.raises(Refused) as refused:  # nobody owns the partition: a rebalance
        owner_elsewhere(app, table, "t-1", PARTITIONS, request())
    assert refused.value.status == 503


async def test_the_owner_gets_the_callers_request_and_credential_and_its_answer_comes_back_as_it_is() -> None:
    seen: list[tuple[str, str, str | None, str | None, bytes]] = []

    async def answer(req: web.Request) -> web.Response:
        seen.append((req.method, req.path_qs, req.headers.get("Authorization"), req.headers.get(ROUTED_HEADER),
                     await req.read()))
        return web.json_response({"error": "nope"}, status=409)

    server = web.Application()
    server.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(server)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    owner = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession() as http:
            app, _ = app_with({}, "http://here:1", http)
            got = await ask_owner(app, owner, request(Authorization="Bearer t"))
            assert got == (409, "application/json", b'{"error": "nope"}')
            await ask_owner(app, owner, request("POST", "/approvals/t-1"), json={"decision": "approve"})
            await ask_owner(app, owner, request("POST", "/conversations/c/delete"), path="/conversations/c?limit=1")
    finally:
        await runner.cleanup()
    assert seen[0] == ("GET", "/tasks/t-1?x=1", "Bearer t", "1", b"")
    assert seen[1][:2] == ("POST", "/approvals/t-1") and json.loads(seen[1][4]) == {"decision": "approve"}
    assert seen[2][:2] == ("GET", "/conversations/c?limit=1"), "a path of its own is read with a GET"


async def test_an_owner_that_does_not_answer_is_a_502_that_says_what_to_do() -> None:
    async with aiohttp.ClientSession() as http:
        app, _ = app_with({}, "http://here:1", http)
        with pytest.raises(Refused) as refused:
            await ask_owner(app, "http://127.0.0.1:9", request(), timeout_s=2, unanswered="retry")
    assert refused.value.status == 502
    assert "(http://127.0.0.1:9) did not answer" in str(refused.value) and str(refused.value).endswith("; retry")
