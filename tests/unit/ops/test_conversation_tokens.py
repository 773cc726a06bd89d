"""Per-conversation tokens (ops/conversation_tokens.py): one conversation, until they expire, only with the
secret that signed them."""

from __future__ import annotations

import base64
import json

from agents_stream.ops import conversation_tokens as tokens

SECRET = "s" * 40


def test_a_token_opens_its_conversation_until_it_expires() -> None:
    token, expires = tokens.issue(SECRET, "c-42", 60, now=1000.0)
    assert expires == 1060 and token.startswith(tokens.PREFIX)
    assert tokens.verify(SECRET, token, now=1059.0) == "c-42"
    assert tokens.verify(SECRET, token, now=1060.0) is None


def test_a_forged_altered_or_foreign_token_opens_nothing() -> None:
    token, _ = tokens.issue(SECRET, "c-42", 60, now=1000.0)
    payload, signature = token[len(tokens.PREFIX):].split(".")
    other = base64.urlsafe_b64encode(json.dumps({"c": "c-43", "e": 9_999_999_999}).encode()).rstrip(b"=").decode()
    assert tokens.verify(SECRET, f"{tokens.PREFIX}{other}.{signature}", now=1001.0) is None  # another conversation
    assert tokens.verify("t" * 40, token, now=1001.0) is None  # another secret
    assert tokens.verify("", token, now=1001.0) is None  # no secret: no tokens
    assert tokens.verify(SECRET, token[:-2], now=1001.0) is None
    assert tokens.verify(SECRET, "conv.!!!.x", now=1001.0) is None
    assert tokens.verify(SECRET, "harness-read-token", now=1001.0) is None


def test_a_tokens_life_is_bounded() -> None:
    _, expires = tokens.issue(SECRET, "c", 10 ** 9, now=0.0)
    assert expires == tokens.MAX_TTL_S
