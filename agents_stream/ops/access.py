"""Who may ask the web views what: the read and write tokens, the Host check (DNS rebinding), the open demo mode.

Every request passes :func:`guard` (an aiohttp middleware) before its view:

- the probes and the scrape (``OPEN_ROUTES``) answer anyone, with any Host, as before;
- every other route answers only a Host header naming this worker (**421** otherwise): a page on another site
  whose name was re-pointed at this address (DNS rebinding) is the same origin for the browser, but still sends
  its own name;
- a read of any other route (GET/HEAD) needs ``AGENTS_STREAM_READ_TOKEN`` or ``AGENTS_STREAM_API_TOKEN``
  (**401**), except the console's static files and the signed approval link (``PAGE_ROUTES``);
- mutations check the write token in their view (agents_stream.ops.web.mutation_body);
- a conversation's own token (agents_stream.ops.conversation_tokens) opens that conversation's routes only.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

from agents_stream.ops import conversation_tokens
from agents_stream.settings import Settings

__all__ = [
    "LOCAL_TOKEN_FILE", "OPEN_ROUTES", "PAGE_ROUTES", "Refused", "allowed_hosts", "check_open_bind",
    "conversation_access", "guard", "host_allowed", "is_loopback", "local_token", "may_read", "may_write",
    "same_origin",
]

#: probes and the Prometheus scrape: no token, any Host (an orchestrator probes a pod by its IP)
OPEN_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})
#: the console's static files (no data in them), the API's OpenAPI document (what the repository's docs/openapi.json
#: says, no data either) and the signed link, whose signature is its credential
PAGE_ROUTES = frozenset({"/", "/console/{name}", "/openapi.json", "/approvals/{task_id}/{decision}"})
#: Host names that reach a loopback bind from this machine only
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
ANY_PORT = -1


class Refused(Exception):
    """A request turned down: the HTTP status and what to do, said to the caller."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(error)
        self.status = status


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: reachable from this machine only."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


#: the local operator token (``agents-stream worker --local-token``, which ``make run`` uses): the worker's
#: AGENTS_STREAM_API_TOKEN when none is set and it listens on loopback, kept in a file only its owner reads; the
#: command line sends it to a worker on this machine when no token is set in its own environment
LOCAL_TOKEN_FILE = Path(".data") / "operator-token"


def local_token(path: Path = LOCAL_TOKEN_FILE, *, create: bool = False) -> str | None:
    """The local operator token in ``path`` (None: no such file, or empty); ``create``: made first if missing, a
    random token in a file of mode 0600."""
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(secrets.token_urlsafe(32) + "\n")
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return token or None


def bind_address(settings: Settings) -> str:
    return settings.web_bind or settings.web_host


def check_open_bind(settings: Settings) -> None:
    """``AGENTS_STREAM_API_OPEN`` serves task data and takes decisions from anyone who reaches the port: only on a
    loopback bind. Raises SystemExit saying what to do instead."""
    if settings.api_open and not is_loopback(bind_address(settings)):
        raise SystemExit(
            f"AGENTS_STREAM_API_OPEN=1 is refused: the web views listen on {bind_address(settings)!r} "
            "(WEB_BIND, else WEB_HOST), which other machines can reach, and open mode lets anyone read task data "
            "and decide approvals. Open mode is for local demos on 127.0.0.1: unset WEB_BIND and WEB_HOST, or set "
            "AGENTS_STREAM_API_TOKEN (and AGENTS_STREAM_READ_TOKEN for read-only users) instead."
        )


def _split_host(value: str, default_port: int) -> tuple[str, int]:
    """``name:port``, ``[v6]:port``, ``name`` → (lower-case name, port); ValueError for a malformed value."""
    value = value.strip().lower().rstrip(".")
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest.removeprefix(":")
    elif value.count(":") == 1:
        name, _, port = value.partition(":")
    else:
        name, port = value, ""  # a bare name or a bare IPv6 address
    if not name or (port and not port.isdigit()):
        raise ValueError(f"{value!r} is not a host[:port]")
    return name.rstrip("."), int(port) if port else default_port


def allowed_hosts(settings: Settings) -> frozenset[tuple[str, int]]:
    """The (name, port) pairs a Host header may name; port ``ANY_PORT`` for a listed name without one."""
    port = settings.web_port
    allowed = {_split_host(settings.web_host, port)}
    bind = settings.web_bind
    if bind and bind not in ("0.0.0.0", "::"):
        allowed.add(_split_host(bind, port))
    if is_loopback(settings.web_host) or (bind and is_loopback(bind)):
        allowed.update((name, port) for name in LOOPBACK_NAMES)
    if settings.public_url:
        public = urlsplit(settings.public_url)
        if public.hostname:
            allowed.add((public.hostname.lower(), public.port or (443 if public.scheme == "https" else 80)))
    for entry in settings.web_allowed_hosts.split(","):
        if entry.strip():
            allowed.add(_split_host(entry, ANY_PORT))
    return frozenset(allowed)


def host_allowed(host: str | None, allowed: frozenset[tuple[str, int]]) -> bool:
    """Whether a request's Host header names this worker (a ``*`` entry allows every Host)."""
    if ("*", ANY_PORT) in allowed:
        return True
    if not host:
        return False
    try:
        name, port = _split_host(host, ANY_PORT)
    except ValueError:
        return False
    # No port: the scheme's default, 80 or 443 (behind a TLS proxy the worker cannot tell which).
    ports = (80, 443) if port == ANY_PORT else (port,)
    return (name, ANY_PORT) in allowed or any((name, p) in allowed for p in ports)


def _bearer(authorization: str, token: str) -> bool:
    return bool(token) and hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode())


def may_write(settings: Settings, authorization: str) -> bool:
    """Mutations: the write token, or the (loopback-only, logged) open mode."""
    return settings.api_open or _bearer(authorization, settings.api_token)


def may_read(settings: Settings, authorization: str) -> bool:
    """Reads of task data: the read token, the write token, or open mode."""
    return may_write(settings, authorization) or _bearer(authorization, settings.read_token)


def conversation_access(settings: Settings, request: Any, *, write: bool) -> bool:
    """The request carries a conversation token that opens this route for this very conversation (a read of one
    of its routes, or ``write``: a message to it)."""
    resource = request.match_info.route.resource
    pattern = resource.canonical if resource is not None else None
    if pattern not in (conversation_tokens.WRITE_ROUTES if write else conversation_tokens.ROUTES):
        return False
    authorization = request.headers.get("Authorization", "")
    if not authorization.startswith("Bearer "):
        return False
    opens = conversation_tokens.verify(settings.conversation_secret, authorization[len("Bearer "):], time.time())
    return opens is not None and opens == request.match_info.get("conversation_id")


def same_origin(request: Any) -> bool:
    """A browser names the page's origin on cross-site requests; a mutation from another site is refused."""
    origin = request.headers.get("Origin")
    if not origin or origin == "null":
        return origin is None
    return bool(origin.split("://", 1)[-1].rstrip("/") == request.host)


def _refusal(status: int, error: str) -> web.Response:
    return web.Response(
        status=status, text=json.dumps({"error": error}), content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def guard(settings: Settings) -> Any:
    """The middleware that applies this module's rules to every request (see the module docstring)."""
    allowed = allowed_hosts(settings)

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        pattern = resource.canonical if resource is not None else None
        if pattern in OPEN_ROUTES:
            return await handler(request)
        host = request.headers.get("Host")
        if not host and not host_allowed("", allowed):
            return _refusal(400, "a Host header naming this worker is required (HTTP/1.1)")
        if not host_allowed(host, allowed):
            return _refusal(421, (
                f"this worker does not answer to Host {host!r}: ask it at its own address (WEB_HOST:WEB_PORT or "
                "AGENTS_STREAM_PUBLIC_URL), or add the name to AGENTS_STREAM_WEB_ALLOWED_HOSTS on the workers"
            ))
        reading = request.method in ("GET", "HEAD")
        if reading and pattern is not None and pattern not in PAGE_ROUTES:
            if not (may_read(settings, request.headers.get("Authorization", ""))
                    or conversation_access(settings, request, write=False)):
                return _refusal(401, (
                    "task data needs a bearer token: Authorization: Bearer <AGENTS_STREAM_READ_TOKEN or "
                    "AGENTS_STREAM_API_TOKEN of the workers>"
                ))
        return await handler(request)

    return check
