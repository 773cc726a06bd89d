"""Approval links and notifications: HMAC-signed, expiring approve/reject links and Slack-compatible webhooks."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import aiohttp
import mode

log = logging.getLogger(__name__)

DECISIONS = ("approve", "reject")


class LinkError(ValueError):
    """A link that does not prove a decision: bad signature, expired, or malformed."""


def _message(task_id: str, decision: str, level: int, by: str, exp: int) -> bytes:
    return "\n".join((task_id, decision, str(level), by, str(exp))).encode("utf-8")


def sign(secret: str, task_id: str, decision: str, level: int, by: str, exp: int) -> str:
    return hmac.new(secret.encode("utf-8"), _message(task_id, decision, level, by, exp), hashlib.sha256).hexdigest()


def link(public_url: str, secret: str, task_id: str, decision: str, level: int, by: str, exp: int) -> str:
    """A signed link: task, decision, level, who it was sent to and its expiry, signed with the secret every worker
    shares (any of them can check it). Opening it shows a confirmation page; only its button (a POST of the same
    fields) decides, so a chat client that prefetches links decides nothing."""
    query = urlencode({"level": level, "by": by, "exp": exp, "sig": sign(secret, task_id, decision, level, by, exp)})
    return f"{public_url.rstrip('/')}/approvals/{quote(task_id, safe='')}/{decision}?{query}"


def verify(secret: str, task_id: str, decision: str, fields: dict[str, str], now: float) -> tuple[int, str]:
    """(level, by) of a genuine, unexpired link; LinkError otherwise."""
    if not secret:
        raise LinkError("approval links are disabled on this worker (AGENTS_STREAM_APPROVAL_SECRET is not set)")
    if decision not in DECISIONS:
        raise LinkError(f"unknown decision {decision!r}; expected approve or reject")
    try:
        level, by, exp, sig = int(fields["level"]), fields["by"], int(fields["exp"]), fields["sig"]
    except (KeyError, ValueError):
        raise LinkError("the link is incomplete: it needs level, by, exp and sig") from None
    expected = sign(secret, task_id, decision, level, by, exp).encode()
    if not hmac.compare_digest(expected, sig.encode("utf-8", "replace")):
        raise LinkError("the link's signature does not match (altered, or signed with another secret)")
    if now > exp:
        raise LinkError("the link has expired: this approval level's time ran out (it was escalated or rejected)")
    return level, by


def slack_message(
    *, task_id: str, agent: str, reason: str, level: int, level_name: str, due: float, instruction: str,
    links: dict[str, str] | None,
) -> dict[str, Any]:
    """A Slack incoming-webhook body (``text`` for any client, ``blocks`` with link buttons for Slack)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(due))
    # ids, names and reasons come from task producers: escaped, so they cannot forge links or formatting
    shown_id, agent, reason, level_name = (_escape(v) for v in (task_id, agent, reason, level_name))
    text = (
        f"Approval needed (level {level + 1}, {level_name}): task {shown_id} of agent {agent}. "
        f"Why: {reason}. Decide before {when}."
    )
    preview = instruction if len(instruction) <= 300 else instruction[:297] + "..."  # plain_text: not parsed
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {
            "type": "mrkdwn",
            "text": f"*Approval needed*: task {shown_id} ({agent})\n*Why:* {reason}\n*Decide before:* {when}",
        }},
        {"type": "section", "text": {"type": "plain_text", "text": preview or "(no instruction)"}},
    ]
    if links:
        blocks.append({"type": "actions", "elements": [
            {"type": "button", "text": {"type": "plain_text", "text": "Approve"}, "style": "primary",
             "url": links["approve"], "action_id": "approve"},
            {"type": "button", "text": {"type": "plain_text", "text": "Reject"}, "style": "danger",
             "url": links["reject"], "action_id": "reject"},
        ]})
        text += f" Approve: {links['approve']} Reject: {links['reject']}"
    else:
        text += f" Decide with agents-stream approve|reject {shown_id}, or POST /approvals/{shown_id}."
    return {"text": text, "blocks": blocks, "task_id": task_id, "level": level}


def _escape(text: str) -> str:
    """Slack's escaping of &, < and > (no link or mention can be formed), and no code spans."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("`", "'")


def _where(url: str) -> str:
    """A webhook URL is a secret (Slack's carry the token in the path): logs name its host only."""
    return urlsplit(url).netloc or "<webhook>"


class Notifier(mode.Service):
    """Posts webhook notifications in the background; owns its session and its posts (stopping ends them)."""

    def __init__(self, timeout_s: float = 10.0, attempts: int = 3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.timeout_s = timeout_s
        self.attempts = attempts
        self._session: aiohttp.ClientSession | None = None
        self._posts: set[asyncio.Task[None]] = set()

    def notify(self, url: str, body: dict[str, Any], subject: str) -> None:
        task = asyncio.ensure_future(self._post(url, body, subject))
        self._posts.add(task)
        task.add_done_callback(self._posts.discard)

    async def _post(self, url: str, body: dict[str, Any], subject: str) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        for attempt in range(1, self.attempts + 1):
            try:
                async with self._session.post(url, json=body) as resp:
                    if resp.status < 300:
                        return
                    problem = f"HTTP {resp.status}"
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                problem = type(exc).__name__
            if attempt < self.attempts:
                await asyncio.sleep(min(2.0**attempt, 10.0))
        log.warning(
            "Approval webhook at %s failed %d times (%s) for %s; the approval still times out and escalates as "
            "configured, and can be decided with the CLI or HTTP: check the webhook URL",
            _where(url), self.attempts, problem, subject,
        )

    async def on_stop(self) -> None:
        for task in list(self._posts):
            task.cancel()
        if self._posts:
            await asyncio.wait(list(self._posts), timeout=5.0)
        if self._session is not None:
            await self._session.close()
