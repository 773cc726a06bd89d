"""What the ``agents-stream`` commands share: their parser hook, one confirmed send, and why the broker failed."""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from typing import Any, Callable

from agents_stream.kafka import security as kafka_security
from agents_stream.ops import tracing
from agents_stream.settings import Settings, bootstrap_servers

__all__ = [
    "AddParser", "broker_call", "broker_unreachable", "flush_traces", "operator_token", "printable", "printable_tree",
    "send_one",
]

#: a command module's ``register(add_parser)`` gets the subparsers' ``add_parser``
AddParser = Callable[..., argparse.ArgumentParser]


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_NEWLINE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")
#: how a value's newline prints in a multi-line view: a new line, indented, so no value starts a line of its own
CONTINUATION = "\n    "


def printable(text: str, *, newlines: bool = False) -> str:
    """``text`` safe to print on a terminal: every control character (escape sequences, carriage returns, and
    newlines unless ``newlines``) shown as ``\\xNN``, so a task id, a name or a reason from a producer cannot
    rewrite the screen. With ``newlines`` a newline starts an indented continuation line (CONTINUATION)."""
    if not newlines:
        return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    escaped = _CONTROL_BUT_NEWLINE.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return escaped.replace("\n", CONTINUATION)


def printable_tree(value: Any, *, newlines: bool = False) -> Any:
    """A JSON value with every string (keys too) made ``printable``, for views rendered as lines (``newlines``:
    a value's newlines print as indented continuation lines; a key's never)."""
    if isinstance(value, str):
        return printable(value, newlines=newlines)
    if isinstance(value, dict):
        return {printable(str(k)): printable_tree(v, newlines=newlines) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_tree(v, newlines=newlines) for v in value]
    return value


def operator_token(settings: Settings, *, write: bool = False) -> str:
    """The token a command sends to a worker's web views: AGENTS_STREAM_READ_TOKEN (reads only), else
    AGENTS_STREAM_API_TOKEN, else, for a worker on this machine (a loopback address), the local operator token
    that ``agents-stream worker --local-token`` (``make run``) wrote to .data/operator-token; "" for none."""
    from urllib.parse import urlsplit

    from agents_stream.ops import access

    token = settings.api_token if write else (settings.read_token or settings.api_token)
    if token:
        return token
    host = urlsplit(settings.link_base()).hostname or ""
    return (access.local_token() or "") if access.is_loopback(host) else ""


async def send_one(
    settings: Settings, topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]] | None = None,
) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap_servers(settings.broker), acks="all", **kafka_security.client_kwargs(settings)
    )
    try:
        await asyncio.wait_for(producer.start(), timeout=30)  # a refused login fails here: still close the producer
        await asyncio.wait_for(producer.send_and_wait(topic, value, key=key, headers=headers), timeout=30)
    finally:
        await asyncio.wait_for(producer.stop(), timeout=30)


#: how long a command waits for its spans to be exported before it exits
TRACES_FLUSH_S = 10.0


def flush_traces() -> None:
    """A command's spans exported before it exits (within TRACES_FLUSH_S: a collector away costs that, no more)."""
    if not tracing.on():
        return
    stopping = tracing.stop_in_background()
    stopping.join(TRACES_FLUSH_S)
    if stopping.is_alive():
        print(f"agents-stream: spans not all exported within {TRACES_FLUSH_S:.0f}s (is the OTLP endpoint up?)",
              file=sys.stderr)


def broker_call(settings: Settings, what: str, coro: Any) -> int:
    from aiokafka.errors import KafkaError

    try:
        asyncio.run(coro)
    except (KafkaError, OSError, TimeoutError) as exc:
        return broker_unreachable(settings, what, exc)
    return 0


def broker_unreachable(settings: Settings, what: str, exc: BaseException) -> int:
    """Say why the broker could not be used: aiokafka's own error only says "Unable to bootstrap"."""
    from aiokafka.errors import KafkaConnectionError

    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, KafkaConnectionError):  # a refused login or TLS handshake ends up here too
        detail = asyncio.run(kafka_security.diagnose(settings, bootstrap_servers(settings.broker)))
    print(f"agents-stream {what}: cannot use the broker at {settings.broker} ({detail}); "
          "check KAFKA_BROKER and the AGENTS_STREAM_KAFKA_* settings", file=sys.stderr)
    return 1
