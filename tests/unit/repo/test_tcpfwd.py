"""The partition harness's TCP forwarder (tests/integration/tcpfwd.py): its --map parsing, and bytes both ways
between two loopback ports."""

from __future__ import annotations

import argparse
import asyncio
import socket

import pytest

from tests.integration.tcpfwd import Forwarder, parse_map


def test_a_map_names_a_listen_address_and_a_target() -> None:
    assert parse_map("127.0.0.1:9092=10.231.7.1:9092") == (("127.0.0.1", 9092), ("10.231.7.1", 9092))
    for bad in ("127.0.0.1:9092", "127.0.0.1=10.0.0.1:1", "127.0.0.1:x=10.0.0.1:1"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_map(bad)


async def test_the_forwarder_pipes_both_ways_and_stops() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data.upper())
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    target = server.sockets[0].getsockname()[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        listen = s.getsockname()[1]
    forwarder = Forwarder([(("127.0.0.1", listen), ("127.0.0.1", target))])
    await forwarder.start()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", listen), 5)
        writer.write(b"fenced?")
        await writer.drain()
        assert await asyncio.wait_for(reader.readexactly(7), 5) == b"FENCED?"
        writer.close()
    finally:
        await forwarder.stop()
        server.close()
        await server.wait_closed()
    with pytest.raises(OSError):
        await asyncio.wait_for(asyncio.open_connection("127.0.0.1", listen), 5)
