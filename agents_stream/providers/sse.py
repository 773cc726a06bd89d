"""Server-Sent Events as the streaming APIs send them (pure): bytes in, (event, data) out.

The three providers' streaming answers are SSE (OpenAI-compatible ``stream: true``, Anthropic ``stream: true``,
Gemini ``:streamGenerateContent?alt=sse``). This parser follows the HTML standard's rules that matter here: lines
end in CRLF, LF or CR; ``data:`` lines of one event are joined with newlines; a blank line ends the event; comment
lines (``:``) and unknown fields are skipped. A line longer than ``max_line`` bytes is an error (a body without
line breaks is not an event stream); the caller bounds the whole body.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Assembly", "SSEError", "SSEEvent", "SSEParser"]


@dataclass(frozen=True)
class SSEEvent:
    event: str  # "message" when the event names none
    data: str


class SSEError(ValueError):
    """The bytes are not an event stream this parser can read."""


class SSEParser:
    """Feed it the body as it arrives; it returns the events each piece completes."""

    def __init__(self, max_line: int = 1 << 20) -> None:
        self.max_line = max_line
        self._pending = b""
        self._event = ""
        self._data: list[str] = []
        self._cr = False  # the last piece ended in CR: an LF that starts the next one belongs to it

    def feed(self, piece: bytes) -> list[SSEEvent]:
        if self._cr and piece.startswith(b"\n"):
            piece = piece[1:]
        self._cr = piece.endswith(b"\r")
        buffer = self._pending + piece
        lines = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        self._pending = lines.pop()
        if len(self._pending) > self.max_line:
            raise SSEError(f"a line of more than {self.max_line} bytes")
        events: list[SSEEvent] = []
        for raw in lines:
            event = self._line(raw.decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
        return events

    def _line(self, line: str) -> SSEEvent | None:
        if not line:
            if not self._data:
                self._event = ""
                return None
            event = SSEEvent(self._event or "message", "\n".join(self._data))
            self._event, self._data = "", []
            return event
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None


class Assembly(Protocol):
    """A provider's streamed answer put back together: the body its non-streaming API would have answered, so the
    same parsing makes the same Completion or Turn of it."""

    def feed(self, event: SSEEvent) -> bool:
        """One event (its text deltas go to the call's sink); True when it ends the stream. Raises a TaskError for
        an error the stream reports."""

    def complete(self) -> bool:
        """The stream may end here (an API without a closing event: its answer said it was finished)."""

    def body(self) -> dict[str, Any]:
        """The non-streaming body the events add up to."""
