"""Approval links, decision signatures and notifications: HMAC-signed approve/reject links bound to one parking
at one level of one app id's task of one agent, signed decision events, and Slack-compatible webhooks posted at a
bounded rate."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from typing import Any, NamedTuple
from urllib.parse import quote, urlencode, urlsplit

import aiohttp
import mode

from agents_stream.background import Background

log = logging.getLogger(__name__)

DECISIONS = ("approve", "reject")


class LinkError(ValueError):
    """A link that does not prove a decision: bad signature, expired, or malformed."""


class LinkClaim(NamedTuple):
    """What a genuine link decides: the level it was sent to, its approver, the parking it belongs to, and the app
    id and agent of the task it was sent for."""

    level: int
    by: str
    #: when the task was parked, in milliseconds (``parked_ms``): a link decides only that parking
    parked: int
    app_id: str
    agent: str


def parked_ms(requested_at: float) -> int:
    """A parking's identity in links and decisions: its ``requested_at`` in whole milliseconds."""
    return int(round(requested_at * 1000))


def _mac(secret: str, *parts: object) -> str:
    message = "\n".join(str(p) for p in parts).encode("utf-8")
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def sign(
    secret: str, task_id: str, decision: str, level: int, by: str, exp: int, parked: int, app_id: str, agent: str,
) -> str:
    """A link's signature (the "link" domain: a link's signature is never a valid decision signature)."""
    return _mac(secret, "link", task_id, decision, level, by, exp, parked, app_id, agent)


#: the query fields of a link, all signed
LINK_FIELDS = ("level", "by", "exp", "parked", "app", "agent", "sig")


def link(
    public_url: str, secret: str, task_id: str, decision: str, level: int, by: str, exp: int, parked: int,
    app_id: str, agent: str,
) -> str:
    """A signed link: task, decision, level, who it was sent to, its expiry, the parking it belongs to and the app
    id and agent of the task, signed with the secret every worker shares (any of them can check it). Opening it
    shows a confirmation page; only its button (a POST of the same fields) decides, so a chat client that
    prefetches links decides nothing."""
    sig = sign(secret, task_id, decision, level, by, exp, parked, app_id, agent)
    query = urlencode({"level": level, "by": by, "exp": exp, "parked": parked, "app": app_id, "agent": agent,
                       "sig": sig})
    return f"{public_url.rstrip('/')}/approvals/{quote(task_id, safe='')}/{decision}?{query}"


def verify(secret: str, task_id: str, decision: str, fields: dict[str, str], now: float) -> LinkClaim:
    """The claim of a genuine, unexpired link; LinkError otherwise. Whether the task is still parked at that level
    and parking is the ledger's check (``tables.approvals.binding_problem``): only it has the record."""
    if not secret:
        raise LinkError("approval links are disabled on this worker (AGENTS_STREAM_APPROVAL_SECRET is not set)")
    if decision not in DECISIONS:
        raise LinkError(f"unknown decision {decision!r}; expected approve or reject")
    try:
        level, by, exp, parked = int(fields["level"]), fields["by"], int(fields["exp"]), int(fields["parked"])
        app_id, agent, sig = fields["app"], fields["agent"], fields["sig"]
    except (KeyError, ValueError):
        raise LinkError(
            "the link is incomplete: it needs level, by, exp, parked, app, agent and sig (a link sent before "
            "decisions named their app id and agent: decide in the console or with agents-stream approve|reject)"
        ) from None
    expected = sign(secret, task_id, decision, level, by, exp, parked, app_id, agent).encode()
    if not hmac.compare_digest(expected, sig.encode("utf-8", "replace")):
        raise LinkError("the link's signature does not match (altered, or signed with another secret)")
    if now > exp:
        raise LinkError("the link has expired: this approval level's time ran out (it was escalated or rejected)")
    return LinkClaim(level, by, parked, app_id, agent)


def decision_signature(
    secret: str, *, task_id: str, decision: str, by: str, via: str, comment: str | None, level: int | None,
    parked: int | None, agent: str | None = None, app_id: str | None = None,
) -> str:
    """The signature a worker or the CLI puts on a decision event it sends (the "decision" domain). The agent and
    the app id are signed when named: with an app id, both take a slot after a marker (no field holds a newline,
    so the part counts tell the forms apart); a cancel of a sub-task names only its agent, as before."""
    named: tuple[str, ...] = () if agent is None else (agent,)
    if app_id is not None:
        named = ("app_id+agent", app_id, agent or "")
    return _mac(
        secret, "decision", task_id, decision, by, via, comment or "", "" if level is None else level,
        "" if parked is None else parked, *named,
    )


def with_signature(secret: str, decision: Any) -> Any:
    """An ApprovalDecision signed with ``secret`` (unchanged without one: the ledger records it as unsigned)."""
    if not secret:
        return decision
    sig = decision_signature(
        secret, task_id=decision.task_id, decision=decision.decision, by=decision.by, via=decision.via,
        comment=decision.comment, level=decision.level, parked=decision.parked, agent=decision.agent,
        app_id=decision.app_id,
    )
    return decision.model_copy(update={"sig": sig})


def decision_signed(secret: str, sig: str | None, **fields: Any) -> bool:
    """Whether a decision event carries a genuine signature (False without a secret to check it with)."""
    if not secret or not sig:
        return False
    return hmac.compare_digest(decision_signature(secret, **fields).encode(), sig.encode("utf-8", "replace"))


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


def handoff_message(
    *, conversation_id: str, agent: str, reason: str, level: int, level_name: str, due: float | None, base: str,
    waiting: int, overdue: bool,
) -> dict[str, Any]:
    """A Slack incoming-webhook body for a conversation waiting for a person at ``level`` (tables/handoff_wait.py);
    ``overdue``: every level's time ran out and the customer still waits."""
    shown_id, agent, reason, level_name = (_escape(v) for v in (conversation_id, agent, reason, level_name))
    head = "Still unanswered after every level" if overdue else f"A customer waits for a person (level {level + 1})"
    when = f" Take it before {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(due))}." if due else ""
    text = (f"{head}, {level_name}: conversation {shown_id} of agent {agent}, {waiting} message(s) waiting. "
            f"Why: {reason}.{when} Take it in the console's Inbox ({base}/), or POST "
            f"/conversations/{shown_id}/handoff, or agents-stream conversations handoff {shown_id}.")
    return {"text": text, "conversation_id": conversation_id, "level": level, "overdue": overdue}


def _escape(text: str) -> str:
    """Slack's escaping of &, < and > (no link or mention can be formed), and no code spans."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("`", "'")


def _where(url: str) -> str:
    """A webhook URL is a secret (Slack's carry the token in the path): logs name its host only."""
    return urlsplit(url).netloc or "<webhook>"


class Pacer:
    """At most ``rate`` starts per second, on a clock passed in: ``wait(now)`` is how long until the next may start."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.next_at = 0.0

    def wait(self, now: float) -> float:
        """Seconds to wait before the next start (0: now); the start is booked when this returns 0."""
        if now < self.next_at:
            return self.next_at - now
        self.next_at = now + self.interval
        return 0.0


class Notifier(mode.Service):
    """Posts webhook notifications in the background at a bounded rate, from a bounded queue.

    At most ``rate_per_s`` posts start per second (retries included) and at most ``concurrency`` are in flight;
    a notification that finds the queue full (``queue_max`` waiting) is dropped with a warning: the approval still
    waits, times out and escalates as configured, and /approvals and the CLI still show it. The service owns its
    session, its sender and its posts (stopping ends them).
    """

    def __init__(
        self, timeout_s: float = 10.0, attempts: int = 3, *, rate_per_s: float = 5.0, queue_max: int = 1000,
        concurrency: int = 4, **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.pacer = Pacer(rate_per_s)
        self.queue: asyncio.Queue[tuple[str, dict[str, Any], str]] = asyncio.Queue(maxsize=max(1, queue_max))
        self.dropped = 0
        self._slots = asyncio.Semaphore(max(1, concurrency))
        self._dropped_logged_at = 0.0
        self._session: aiohttp.ClientSession | None = None
        self._posts = Background("approval webhook posts")

    def notify(self, url: str, body: dict[str, Any], subject: str) -> None:
        try:
            self.queue.put_nowait((url, body, subject))
        except asyncio.QueueFull:
            self.dropped += 1
            now = time.monotonic()
            if now - self._dropped_logged_at >= 10.0:  # one line per 10 s however many are dropped
                self._dropped_logged_at = now
                log.warning(
                    "Approval webhook queue is full (%d waiting, %d dropped so far); dropped the notification for %s: "
                    "the approval still times out and escalates, and /approvals and the CLI list it. Raise "
                    "AGENTS_STREAM_WEBHOOK_RATE_PER_S or AGENTS_STREAM_WEBHOOK_QUEUE_MAX if this is expected load",
                    self.queue.qsize(), self.dropped, subject,
                )

    @mode.Service.task
    async def _sender(self) -> None:
        """Takes queued notifications in order and starts each when the rate and a slot allow."""
        while not self.should_stop:
            url, body, subject = await self.queue.get()
            await self._slots.acquire()
            await self._paced()  # here, not in the post: first attempts start in the order they were queued
            self._posts.start(self._post(url, body, subject))

    async def _paced(self) -> None:
        while (delay := self.pacer.wait(time.monotonic())) > 0:
            await asyncio.sleep(delay)

    async def _post(self, url: str, body: dict[str, Any], subject: str) -> None:
        try:
            await self._attempts(url, body, subject)
        finally:
            self._slots.release()

    async def _attempts(self, url: str, body: dict[str, Any], subject: str) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        for attempt in range(1, self.attempts + 1):
            if attempt > 1:
                await self._paced()  # a retry counts against the rate too
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
        await self._posts.stop()
        if self._session is not None:
            await self._session.close()
