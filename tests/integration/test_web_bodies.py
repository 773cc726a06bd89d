"""Request bodies over a raw socket, on a real worker: a body split across TCP segments or sent chunked is read
whole up to the cap, refused past it, and JSON nested too deeply is a 400."""

from __future__ import annotations

import asyncio
import json

from .harness import unique

TOKEN = "bodies-token"
PAUSE_S = 0.3  # long enough that each piece reaches the worker as its own read


async def raw_post(port: int, path: str, pieces: list[bytes], *, chunked: bool, length: int | None = None) -> tuple[
        int, dict]:
    """POST ``pieces`` one at a time with pauses between (as chunks when ``chunked``); (status, JSON answer)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {length or sum(map(len, pieces))}"
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\n{framing}\r\nConnection: close\r\n\r\n")
    try:
        writer.write(head.encode())
        for piece in pieces:
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece)
            await writer.drain()
            await asyncio.sleep(PAUSE_S)
        if chunked:
            writer.write(b"0\r\n\r\n")
            await writer.drain()
    except ConnectionError:
        pass  # the worker answered (413) and closed before the rest: read what it said
    answer = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    head_part, _, body = answer.partition(b"\r\n\r\n")
    status = int(head_part.split(b" ", 2)[1])
    if b"chunked" in head_part.lower():  # the answer itself may be chunked: take the one data chunk
        body = body.split(b"\r\n", 2)[1]
    return status, json.loads(body)


def pieces_of(body: bytes, n: int) -> list[bytes]:
    size = -(-len(body) // n)
    return [body[i:i + size] for i in range(0, len(body), size)]


async def test_a_body_in_several_segments_or_chunks_is_read_whole_and_capped(cluster_factory):
    """A cancel whose JSON arrives in three segments, or in three chunks, is accepted as sent (not cut at the
    first segment); a chunked body past 64 KiB in small chunks is a 413; 60,000 nested '[' are a 400."""
    c = cluster_factory([unique("bodies")], None, AGENTS_STREAM_API_TOKEN=TOKEN)
    w = await c.started()
    for chunked in (False, True):
        job_id = unique("job")
        body = json.dumps({"by": "ops", "reason": "split " + "r" * 300}).encode()
        status, answer = await raw_post(w.web_port, f"/jobs/{job_id}/cancel", pieces_of(body, 3), chunked=chunked)
        assert (status, answer) == (202, {"accepted": True, "job_id": job_id, "by": "ops"}), (chunked, status, answer)

    big = json.dumps({"by": "ops", "reason": "x" * 70_000}).encode()
    status, answer = await raw_post(w.web_port, f"/jobs/{unique('job')}/cancel", pieces_of(big, 9), chunked=True)
    assert status == 413 and "over 65536 bytes" in answer["error"], (status, answer)

    deep = b"[" * 60_000
    status, answer = await raw_post(w.web_port, f"/jobs/{unique('job')}/cancel", [deep], chunked=False)
    assert status == 400 and "deeper than 32 levels" in answer["error"], (status, answer)
    assert (await w.readyz())["status"] == "ready", "the worker keeps serving"
