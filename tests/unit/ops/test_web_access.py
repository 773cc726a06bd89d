"""The web's access rules, bodies and pages as pure logic: Host names, tokens, the open-mode bind, body reading
and JSON depth, the approvals and dead-letter pages (no server, no broker)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agents_stream.kafka.deadletters import DeadLetter
from agents_stream.ops import access, bodies, dlq_pages, pages
from agents_stream.ops.access import Refused
from agents_stream.settings import Settings


def settings(**overrides: Any) -> Settings:
    return Settings.from_env({}, **overrides)


# -- Host header -------------------------------------------------------------------------------------------------


def test_a_loopback_worker_answers_its_own_address_and_the_localhost_aliases_only() -> None:
    """DNS rebinding: only names of this worker pass; another name, another port or a look-alike does not."""
    allowed = access.allowed_hosts(settings(web_port=7000))
    for host in ("127.0.0.1:7000", "localhost:7000", "LOCALHOST:7000", "[::1]:7000", "localhost.:7000"):
        assert access.host_allowed(host, allowed), host
    for host in ("evil.example:7000", "127.0.0.1:7001", "localhost", "localhost.evil.example:7000", "", None,
                 "127.0.0.1:70x0", "[::1"):
        assert not access.host_allowed(host, allowed), host


def test_a_worker_on_another_address_does_not_answer_localhost_but_its_allow_list_and_public_url() -> None:
    """WEB_HOST 10.0.0.5: localhost is not this worker; AGENTS_STREAM_WEB_ALLOWED_HOSTS and the public URL are."""
    s = settings(web_host="10.0.0.5", web_bind="0.0.0.0", web_port=6066, public_url="https://ops.example.com/",
                 web_allowed_hosts="proxy.internal, lb:8080")
    allowed = access.allowed_hosts(s)
    for host in ("10.0.0.5:6066", "ops.example.com", "ops.example.com:443", "proxy.internal", "proxy.internal:9",
                 "lb:8080"):
        assert access.host_allowed(host, allowed), host
    for host in ("localhost:6066", "127.0.0.1:6066", "0.0.0.0:6066", "lb:8081", "ops.example.com:80"):
        assert not access.host_allowed(host, allowed), host
    assert access.host_allowed("anything:1", access.allowed_hosts(settings(web_allowed_hosts="*")))


# -- tokens and open mode ------------------------------------------------------------------------------------------


def test_the_read_token_reads_and_the_write_token_does_both() -> None:
    """A read-only user cannot decide; no configured token never matches an empty or a bare header."""
    s = settings(api_token="w-token", read_token="r-token")
    assert access.may_read(s, "Bearer r-token") and not access.may_write(s, "Bearer r-token")
    assert access.may_read(s, "Bearer w-token") and access.may_write(s, "Bearer w-token")
    for given in ("", "Bearer ", "Bearer r-tokenx", "r-token", "Basic r-token"):
        assert not access.may_read(s, given), given
    none = settings()
    assert not access.may_read(none, "") and not access.may_read(none, "Bearer ") and not access.may_write(none, "")
    assert access.may_read(settings(api_open=True), "") and access.may_write(settings(api_open=True), "")


def test_open_mode_is_refused_unless_the_web_listens_on_loopback() -> None:
    """AGENTS_STREAM_API_OPEN with WEB_BIND 0.0.0.0 (or a WEB_HOST others reach) stops the start, saying why."""
    access.check_open_bind(settings(api_open=True))
    access.check_open_bind(settings(api_open=True, web_host="127.0.0.2"))
    access.check_open_bind(settings(api_open=True, web_host="10.0.0.5", web_bind="::1"))
    access.check_open_bind(settings(web_bind="0.0.0.0"))
    for overrides in ({"web_bind": "0.0.0.0"}, {"web_host": "10.0.0.5"}, {"web_bind": "worker.example"}):
        with pytest.raises(SystemExit, match="AGENTS_STREAM_API_OPEN=1 is refused"):
            access.check_open_bind(settings(api_open=True, **overrides))


def test_the_read_token_is_a_secret_never_shown() -> None:
    assert "r-secret" not in repr(settings(read_token="r-secret"))


# -- bodies ----------------------------------------------------------------------------------------------------------


class Pieces:
    """A body stream that hands out what has "arrived": one piece per read, as a TCP segment would."""

    def __init__(self, *pieces: bytes, stall: bool = False) -> None:
        self.pieces = list(pieces)
        self.stall = stall

    async def read(self, n: int) -> bytes:
        if not self.pieces:
            if self.stall:
                await asyncio.sleep(3600)
            return b""
        piece = self.pieces.pop(0)
        head, rest = piece[:n], piece[n:]
        if rest:
            self.pieces.insert(0, rest)
        return head


async def test_a_body_is_read_whole_across_pieces_and_refused_past_the_cap() -> None:
    assert await bodies.read_body(Pieces(b'{"a":', b' 1', b"}")) == b'{"a": 1}'
    assert await bodies.read_body(Pieces(b"x" * 10, b"y" * 10), cap=20) == b"x" * 10 + b"y" * 10
    with pytest.raises(Refused) as too_big:
        await bodies.read_body(Pieces(*[b"z" * 8] * 4), cap=30)
    assert too_big.value.status == 413
    with pytest.raises(Refused) as slow:
        await bodies.read_body(Pieces(b"{", stall=True), timeout=0.05)
    assert slow.value.status == 408


def test_deep_json_is_a_400_before_it_is_parsed() -> None:
    """100k nested '[' would make json.loads recurse into a RecursionError (a 500): refused by depth first."""
    assert bodies.json_depth(b'{"a": [1, {"b": "[[[[{{"}]}') == 3
    assert bodies.parse_json(b'{"a": "]]]]"}') == {"a": "]]]]"}
    assert bodies.json_depth(b'"\\"[[["') == 0, "an escaped quote does not end the string"
    for raw in (b"[" * 100_000, b'{"a":' * 40 + b"1" + b"}" * 40):
        with pytest.raises(Refused) as deep:
            bodies.parse_json(raw)
        assert deep.value.status == 400 and "deeper than 32" in str(deep.value)
    with pytest.raises(Refused, match="not JSON"):
        bodies.parse_json(b"{nope")


# -- pages -----------------------------------------------------------------------------------------------------------


def test_approvals_pages_merge_every_workers_share_oldest_first() -> None:
    """Two workers' shares, paged by two: every parked task once, oldest first; ``count`` is all of them."""
    one = [{"task_id": f"a{i}", "requested_at": float(i * 2)} for i in range(3)]
    two = [{"task_id": f"b{i}", "requested_at": float(i * 2 + 1)} for i in range(3)]
    seen: list[str] = []
    after = None
    for _ in range(10):
        page = pages.merge_approvals([pages.page_approvals(one, after, 2), pages.page_approvals(two, after, 2)], 2)
        assert page["count"] == 6
        seen += [a["task_id"] for a in page["awaiting"]]
        if not page["next"]:
            break
        after = pages.parse_after(page["next"])
    assert seen == ["a0", "b0", "a1", "b1", "a2", "b2"]
    with pytest.raises(ValueError, match="not a cursor"):
        pages.parse_after("yesterday")
    assert pages.limit_of({"limit": "5000"}, 100, 1000) == 1000 and pages.limit_of({}, 100, 1000) == 100


def letter(topic: str, partition: int, offset: int, second: int) -> DeadLetter:
    headers = {"failed_at": f"2026-01-01T00:00:{second:02d}Z", "error_layer": "schema" if second % 2 else "x"}
    return DeadLetter(topic, partition, offset, f"t{second}".encode(), b"{}", headers)


async def test_dead_letter_pages_walk_back_newest_first_reading_blocks_only() -> None:
    """Three partitions merged by failed_at, two at a time: each letter once, newest first; reads are blocks
    below the cursor, never the whole partition at once; a filter keeps only what it matches."""
    stored = {("t.dlq", p): [letter("t.dlq", p, o, o * 3 + p) for o in range(5)] for p in range(3)}
    bounds = {pos: (0, 5) for pos in stored}
    reads: list[tuple[int, int]] = []

    async def read_block(topic: str, partition: int, lo: int, hi: int) -> list[DeadLetter]:
        reads.append((lo, hi))
        return [d for d in stored[(topic, partition)] if lo <= d.offset < hi]

    seconds: list[int] = []
    cursor = None
    for _ in range(20):
        page = await dlq_pages.newest_first(bounds, read_block, limit=2, keep=lambda d: True, cursor=cursor, block=2)
        seconds += [int(d.headers["failed_at"][-3:-1]) for d in page.letters]
        if page.next is None:
            break
        cursor = dlq_pages.decode_cursor(page.next)
    assert seconds == list(range(14, -1, -1)), seconds
    assert all(hi - lo <= 2 for lo, hi in reads)

    schema = lambda d: d.headers["error_layer"] == "schema"  # noqa: E731
    odd = await dlq_pages.newest_first(bounds, read_block, limit=100, keep=schema)
    assert [int(d.headers["failed_at"][-3:-1]) for d in odd.letters] == list(range(13, 0, -2)) and odd.next is None
    short = await dlq_pages.newest_first(bounds, read_block, limit=100, keep=lambda d: False, max_scan=4)
    assert short.letters == [] and short.scanned == 4 and short.next is not None, "a short page says where to go on"
    with pytest.raises(ValueError, match="not a cursor"):
        dlq_pages.decode_cursor("garbage!")


def test_make_runs_local_operator_token_protects_reads_and_the_cli_finds_it_for_localhost(
    tmp_path: Any, monkeypatch: Any,
) -> None:
    """issue 29 item 4: `make run` (worker --local-token) sets no token → a local operator token in
    .data/operator-token (mode 0600, kept across starts), said once; the command line sends it to a worker on a
    loopback address only, and never over a token set in its environment."""
    import io
    import os
    import stat

    from agents_stream.ops import access
    from agents_stream.ops.cli import use_local_token
    from agents_stream.ops.cli_common import operator_token

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AGENTS_STREAM_API_TOKEN", raising=False)
    said = io.StringIO()
    token = use_local_token(Settings.from_env({}), out=said)
    assert token and os.environ["AGENTS_STREAM_API_TOKEN"] == token and token in said.getvalue()
    assert stat.S_IMODE((tmp_path / access.LOCAL_TOKEN_FILE).stat().st_mode) == 0o600
    assert use_local_token(Settings.from_env({}), out=io.StringIO()) == token  # the same file, the same token
    assert use_local_token(Settings.from_env({"AGENTS_STREAM_API_TOKEN": "mine"}), out=io.StringIO()) is None
    assert use_local_token(Settings.from_env({"WEB_BIND": "0.0.0.0"}), out=io.StringIO()) is None
    assert access.may_read(Settings.from_env({"AGENTS_STREAM_API_TOKEN": token}), f"Bearer {token}")
    assert not access.may_read(Settings.from_env({"AGENTS_STREAM_API_TOKEN": token}), "")
    assert operator_token(Settings.from_env({})) == token  # localhost:6066
    assert operator_token(Settings.from_env({}), write=True) == token
    assert operator_token(Settings.from_env({"AGENTS_STREAM_PUBLIC_URL": "https://ops.example.com"})) == ""
    assert operator_token(Settings.from_env({"AGENTS_STREAM_READ_TOKEN": "r"})) == "r"
    monkeypatch.chdir(tmp_path / ".data")  # no .data/operator-token here
    assert operator_token(Settings.from_env({})) == ""
