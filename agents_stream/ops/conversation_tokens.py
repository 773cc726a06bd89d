"""Per-conversation tokens: a signed, expiring bearer token that opens one conversation's API to its own end user.

``conv.<payload>.<signature>``: the payload is base64url JSON ``{"c": conversation_id, "e": expiry (epoch s)}``,
the signature HMAC-SHA256 of it with AGENTS_STREAM_CONVERSATION_SECRET (the same on every worker, so any worker
checks a token any other issued). A browser may hold one: it reads and writes that conversation only
(``ROUTES``), never another one or any operator view (docs/conversations.md, "Access").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

__all__ = ["MAX_TTL_S", "PREFIX", "ROUTES", "WRITE_ROUTES", "issue", "verify"]

PREFIX = "conv."
#: the longest a token may live
MAX_TTL_S = 30 * 24 * 3600
#: what a conversation token opens (the route patterns of ops/web_conversations.py and ops/web_events.py)
ROUTES = frozenset({
    "/conversations/{conversation_id}", "/conversations/{conversation_id}/messages",
    "/conversations/{conversation_id}/messages/{message_id}", "/conversations/{conversation_id}/events",
})
#: of them, the one it may write: a message (never a delete, nor another token)
WRITE_ROUTES = frozenset({"/conversations/{conversation_id}/messages"})


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _sign(secret: str, payload: str) -> str:
    return _b64(hmac.new(secret.encode(), f"conversation-token:{payload}".encode(), hashlib.sha256).digest())


def issue(secret: str, conversation_id: str, ttl_s: float, now: float) -> tuple[str, int]:
    """A token for ``conversation_id`` that expires ``ttl_s`` from ``now``; (token, expiry epoch seconds)."""
    expires = int(now + min(max(ttl_s, 1), MAX_TTL_S))
    payload = _b64(json.dumps({"c": conversation_id, "e": expires}, separators=(",", ":")).encode())
    return f"{PREFIX}{payload}.{_sign(secret, payload)}", expires


def verify(secret: str, token: str, now: float) -> str | None:
    """The conversation a token opens now, or None (no secret, malformed, forged, or expired)."""
    if not secret or not token.startswith(PREFIX):
        return None
    payload, _, signature = token[len(PREFIX):].partition(".")
    if not hmac.compare_digest(signature.encode(), _sign(secret, payload).encode()):
        return None
    try:
        claims: Any = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(claims, dict) or not isinstance(claims.get("c"), str) or not isinstance(claims.get("e"), int):
        return None
    return claims["c"] if now < claims["e"] else None
