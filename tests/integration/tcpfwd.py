"""A TCP forwarder for the network-partition harness (netpart.py): ``python -m tests.integration.tcpfwd
--map 127.0.0.1:9092=10.231.7.1:9092 ...`` listens on each left address and pipes every connection to the right one.

One runs inside a test's network namespace and one on the host, so that a worker in the namespace reaches the
broker, the fake LLM and the fake services at their usual 127.0.0.1 addresses through the namespace's veth pair —
and loses them for real when that link is cut. It prints ``tcpfwd ready`` once every listener is open, and runs
until SIGTERM or SIGINT. Only the addresses its owner gives are ever connected to (loopback and the harness's own
veth addresses).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket

#: bytes read per chunk; a Kafka fetch answer is piped through in chunks of this size
_CHUNK = 64 * 1024
#: how long a connect to the far side may take before the near connection is dropped: a cut link loses the SYN, and
#: Linux gives a connect up after about 127 s (tcp_syn_retries 6), so a connection opened during a cut hangs as
#: one to a partitioned host would, instead of ending early as if the host had answered
_CONNECT_TIMEOUT_S = 130.0
#: linux/tcp.h TCP_RTO_MAX_MS (Linux 6.15+): the longest retransmission timeout of a socket. Kernel default 120 s:
#: after a cut of 20 s the next retransmission can come 20 s after the heal; at 1 s (the least allowed) a healed
#: link carries the held bytes within a second, so a test knows when the worker has them. The retransmissions then
#: come every second, and the kernel gives a connection up after tcp_retries2 (15) of them: TCP_USER_TIMEOUT keeps
#: it open for as long as a real partition's connection would be (minutes), so a cut never looks like a reset.
_TCP_RTO_MAX_MS, _RTO_MAX_MS = 44, 1000
_USER_TIMEOUT_MS = 300_000


def _quick_retransmits(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # an older kernel: retransmissions back off to its own maximum
            sock.setsockopt(socket.IPPROTO_TCP, _TCP_RTO_MAX_MS, _RTO_MAX_MS)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, _USER_TIMEOUT_MS)


def parse_map(text: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """``listen_host:port=target_host:port`` → ((listen_host, port), (target_host, port))."""
    left, sep, right = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LISTEN_HOST:PORT=TARGET_HOST:PORT")

    def addr(a: str) -> tuple[str, int]:
        host, _, port = a.rpartition(":")
        if not host or not port.isdigit():
            raise argparse.ArgumentTypeError(f"{a!r}: expected HOST:PORT")
        return host, int(port)

    return addr(left), addr(right)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class Forwarder:
    def __init__(self, maps: list[tuple[tuple[str, int], tuple[str, int]]]) -> None:
        self.maps = maps
        self._servers: list[asyncio.Server] = []
        # owned: every connection's pipes, cancelled at stop()
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        for (lhost, lport), target in self.maps:
            server = await asyncio.start_server(
                lambda r, w, t=target: self._connection(r, w, t), lhost, lport, reuse_address=True,
            )
            self._servers.append(server)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          target: tuple[str, int]) -> None:
        try:
            far_reader, far_writer = await asyncio.wait_for(asyncio.open_connection(*target), _CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            writer.close()
            return
        _quick_retransmits(writer)
        _quick_retransmits(far_writer)
        for pipe in (_pipe(reader, far_writer), _pipe(far_reader, writer)):
            task = asyncio.ensure_future(pipe)
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._pipes):
            task.cancel()
        if self._pipes:
            await asyncio.wait(list(self._pipes), timeout=2)


async def _main(maps: list[tuple[tuple[str, int], tuple[str, int]]]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    forwarder = Forwarder(maps)
    await forwarder.start()
    print("tcpfwd ready", flush=True)
    await stop.wait()  # the process's whole life: its owner ends it by PID
    await forwarder.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--map", type=parse_map, action="append", required=True, dest="maps")
    asyncio.run(_main(parser.parse_args(argv).maps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
