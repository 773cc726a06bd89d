"""A TCP server that accepts connections, counts them and never answers: what a schema's remote $ref points at.

It runs in its own thread, so an event loop blocked by a client of it cannot hide it. Each connection is closed
after ``hold_s``, so a client stuck on it (urllib without a timeout) ends and a test fails instead of hanging.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["SilentServer"]


class SilentServer:
    """Accepts TCP connections, counts them, never answers; closes each after ``hold_s``."""

    def __init__(self, hold_s: float = 5.0) -> None:
        self.hold_s = hold_s
        self.connections = 0
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self._sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="silent-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}/schema.json"

    def _serve(self) -> None:
        held: list[tuple[socket.socket, float]] = []
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
                self.connections += 1
                held.append((conn, time.monotonic() + self.hold_s))
            except TimeoutError:
                pass
            for conn, until in [h for h in held if h[1] < time.monotonic()]:
                conn.close()
                held.remove((conn, until))
        for conn, _ in held:
            conn.close()

    @contextmanager
    def running(self) -> Iterator[SilentServer]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(timeout=5)
            self._sock.close()
