"""Newest-first pages of the dead-letter topics for ``GET /dlq``, read backwards from each partition's end in
blocks: a page reads the records it shows (and at most ``MAX_SCAN``), never a whole topic."""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

from agents_stream.kafka.deadletters import DeadLetter, partitions_of
from agents_stream.settings import bootstrap_servers

__all__ = ["BLOCK", "MAX_SCAN", "Page", "decode_cursor", "encode_cursor", "newest_first", "read_one", "read_page"]

#: records read at a time from one partition, walking back from its end
BLOCK = 100
#: records one page may look at; a filter matching few records gives a short page and a cursor to go on
MAX_SCAN = 5000

#: (topic, partition)
Position = tuple[str, int]
#: (topic, partition, lo, hi) → the records with lo <= offset < hi, any order
ReadBlock = Callable[[str, int, int, int], Awaitable[list[DeadLetter]]]


@dataclass(frozen=True)
class Page:
    letters: list[DeadLetter]
    #: where the next (older) page starts; None when nothing older is left
    next: str | None
    #: records looked at for this page (matching the filter or not)
    scanned: int


def encode_cursor(positions: Mapping[Position, int]) -> str:
    """An opaque ``before`` value: per partition, the offset the next page reads below."""
    rows = sorted([topic, partition, offset] for (topic, partition), offset in positions.items())
    return base64.urlsafe_b64encode(json.dumps(rows, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(text: str) -> dict[Position, int]:
    """The positions of a ``before`` cursor; ValueError for anything this module did not write."""
    try:
        rows = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        out = {(str(t), int(p)): int(o) for t, p, o in rows}
    except Exception:  # malformed base64, JSON or shape: all the caller's mistake
        raise ValueError(f"{text[:40]!r} is not a cursor of GET /dlq (use the 'next' of the previous page)") from None
    if any(o < 0 or p < 0 for (_, p), o in out.items()):
        raise ValueError("a cursor offset is negative")
    return out


def _newest_key(dl: DeadLetter) -> tuple[str, int]:
    return dl.headers.get("failed_at", ""), dl.offset


async def newest_first(
    bounds: Mapping[Position, tuple[int, int]], read_block: ReadBlock, *, limit: int,
    keep: Callable[[DeadLetter], bool], cursor: Mapping[Position, int] | None = None,
    block: int = BLOCK, max_scan: int = MAX_SCAN,
) -> Page:
    """Merge the partitions (``bounds``: their first and end offsets) newest first by ``failed_at``, keeping what
    ``keep`` accepts, until ``limit`` records or ``max_scan`` looked at; each partition is read back in blocks."""
    cursor = cursor or {}
    low = {p: lo for p, (lo, _) in bounds.items()}
    resume = {p: max(lo, min(cursor.get(p, hi), hi)) for p, (lo, hi) in bounds.items()}
    fetched_to = dict(resume)  # the lowest offset read so far
    buffers: dict[Position, list[DeadLetter]] = {p: [] for p in bounds}  # oldest first: pop() is the newest

    async def refill(p: Position) -> None:
        while not buffers[p] and fetched_to[p] > low[p]:
            lo = max(low[p], fetched_to[p] - block)
            got = await read_block(p[0], p[1], lo, fetched_to[p])
            buffers[p] = sorted((d for d in got if lo <= d.offset < fetched_to[p]), key=lambda d: d.offset)
            fetched_to[p] = lo

    for p in bounds:
        await refill(p)
    out: list[DeadLetter] = []
    scanned = 0
    while len(out) < limit and scanned < max_scan:
        live = [p for p in bounds if buffers[p]]
        if not live:
            break
        p = max(live, key=lambda q: _newest_key(buffers[q][-1]))
        dl = buffers[p].pop()
        resume[p] = dl.offset
        scanned += 1
        if keep(dl):
            out.append(dl)
        await refill(p)
    more = any(buffers[p] or fetched_to[p] > low[p] for p in bounds)
    return Page(out, encode_cursor(resume) if more else None, scanned)


def _letter(tp: Any, record: Any) -> DeadLetter:
    headers = {k: v.decode("utf-8", "replace") for k, v in (record.headers or ())}
    return DeadLetter(tp.topic, tp.partition, record.offset, record.key, record.value, headers)


class _Reader:
    """One consumer without a group, reading blocks of one partition at a time, all before one deadline."""

    def __init__(self, broker: str, timeout: float, security: Mapping[str, Any] | None) -> None:
        from aiokafka import AIOKafkaConsumer

        self.timeout = timeout
        self.deadline = asyncio.get_running_loop().time() + timeout
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap_servers(broker), group_id=None, enable_auto_commit=False, **(security or {}),
        )

    def left(self) -> float:
        left = self.deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise TimeoutError(f"reading the dead-letter topics took longer than {self.timeout:.0f}s")
        return left

    async def bounds(self, parts: list[Any]) -> dict[Position, tuple[int, int]]:
        begins = await asyncio.wait_for(self.consumer.beginning_offsets(parts), self.left())
        ends = await asyncio.wait_for(self.consumer.end_offsets(parts), self.left())
        return {(tp.topic, tp.partition): (begins[tp], ends[tp]) for tp in parts}

    async def read_block(self, topic: str, partition: int, lo: int, hi: int) -> list[DeadLetter]:
        from aiokafka import TopicPartition

        tp = TopicPartition(topic, partition)
        self.consumer.assign([tp])
        self.consumer.seek(tp, lo)
        out: list[DeadLetter] = []
        while await asyncio.wait_for(self.consumer.position(tp), self.left()) < hi:
            batch = await self.consumer.getmany(tp, timeout_ms=int(min(500, self.left() * 1000)), max_records=hi - lo)
            out.extend(_letter(tp, r) for r in batch.get(tp, ()) if lo <= r.offset < hi)
        return out


async def read_page(
    broker: str, names: list[str], *, limit: int, keep: Callable[[DeadLetter], bool], before: str | None = None,
    timeout: float = 20.0, security: Mapping[str, Any] | None = None,
) -> tuple[Page, dict[str, int]]:
    """A page of these dead-letter topics, and how many records each topic retains (from its offsets)."""
    cursor = decode_cursor(before) if before else None
    parts = await partitions_of(broker, names, timeout, security)
    if not parts:
        return Page([], None, 0), {}
    reader = _Reader(broker, timeout, security)
    await asyncio.wait_for(reader.consumer.start(), reader.left())
    try:
        bounds = await reader.bounds(parts)
        page = await newest_first(bounds, reader.read_block, limit=limit, keep=keep, cursor=cursor)
    finally:
        await asyncio.wait_for(reader.consumer.stop(), timeout)
    retained: dict[str, int] = {}
    for (topic, _), (lo, hi) in bounds.items():
        retained[topic] = retained.get(topic, 0) + hi - lo
    return page, retained


async def read_one(
    broker: str, topic: str, partition: int, offset: int, *, timeout: float = 20.0,
    security: Mapping[str, Any] | None = None,
) -> DeadLetter | None:
    """The one record at ``topic:partition:offset``, or None when the topic, partition or offset is not there."""
    parts = [tp for tp in await partitions_of(broker, [topic], timeout, security) if tp.partition == partition]
    if not parts:
        return None
    reader = _Reader(broker, timeout, security)
    await asyncio.wait_for(reader.consumer.start(), reader.left())
    try:
        lo, hi = (await reader.bounds(parts))[(topic, partition)]
        if not lo <= offset < hi:
            return None
        found = await reader.read_block(topic, partition, offset, offset + 1)
    finally:
        await asyncio.wait_for(reader.consumer.stop(), timeout)
    return found[0] if found else None
