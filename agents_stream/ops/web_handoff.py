"""The human-handoff views (docs/guide/handoff.md): ``GET /handoffs`` (the operators' inbox, gathered from every
worker) and ``POST /conversations/<id>/handoff``, ``/reply``, ``/handback`` (write token, as approvals).

An action is checked against the conversation where it lives (404 unknown, 409 not held by a person, 400 a bad
body) and then published on the conversation's task topic, keyed like its messages: its ledger applies it in order
with them, and checks again (tables/handoff.py). ``action_id`` (made here when the client sends none, and
returned) makes a retry or a double click one action; a console or a client sends the same id again.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any, Iterable

from faust.web import Request, Response, View
from pydantic import ValidationError

from agents_stream.contract.conversation_messages import ConversationAction
from agents_stream.ops import api_models as api
from agents_stream.ops.access import Refused
from agents_stream.ops.bodies import mutation_body
from agents_stream.ops.routing import ROUTED_HEADER, active_partitions, forwarded_headers, gather
from agents_stream.ops.web_conversations import publish, view_of
from agents_stream.tables import handoff
from agents_stream.tables.conversations import SEP, ConversationRecord

if TYPE_CHECKING:
    from agents_stream.ops.web import Worker

__all__ = ["inbox", "register_handoff_views"]

EXPECTED = '{"by": "<who>", "text": "<the reply, reason or note>", "action_id": "<optional: the same on a retry>"}'
#: held conversations one worker lists at most (the oldest first)
INBOX_MAX = 500
#: entries of the local store one inbox request reads at most per partition (a held head is found among them)
SCAN_MAX = 100_000


def inbox(table: Any, partitions: Iterable[int], now: float) -> list[dict[str, Any]]:
    """The conversations held by a person (or waiting for one) on ``partitions`` (this worker's own, not its
    standby copies, which may be behind), oldest handoff first."""
    found: list[dict[str, Any]] = []
    for partition in sorted(partitions):
        entries, _ = table.scan(partition, None, SCAN_MAX) if hasattr(table, "scan") else ([], None)
        for key, value in entries:
            if SEP not in key and isinstance(value, dict) and value.get("held_by") is not None:
                found.append(handoff.inbox_entry(key, ConversationRecord.from_json(value), now))
    return sorted(found, key=lambda e: e["held_at"] or 0.0)[:INBOX_MAX]


def register_handoff_views(app: Any, runtime: Worker) -> None:
    settings = runtime.settings
    table = runtime.tables.conversations

    @app.page("/handoffs")
    class Inbox(View):
        async def get(self, request: Request) -> Response:
            mine = inbox(table, active_partitions(app, table), time.time())
            if request.headers.get(ROUTED_HEADER):
                return self.json({"worker": runtime.worker_id, "conversations": mine})
            bodies, missing = await gather(app, request.rel_url.raw_path_qs, forwarded_headers(request))
            merged: dict[str, dict[str, Any]] = {}
            for entry in mine + [e for b in bodies for e in b.get("conversations", [])]:
                merged.setdefault(entry["conversation_id"], entry)
            listed = sorted(merged.values(), key=lambda e: e["held_at"] or 0.0)
            return self.json(api.answer(api.HandoffInbox, worker=runtime.worker_id, conversations=listed,
                                        unreachable=missing))

    def action_view(action: str) -> type[View]:
        class Act(View):
            async def post(self, request: Request, conversation_id: str) -> Response:
                try:
                    body = await mutation_body(settings, request)
                    text = body.get("text") if body.get("text") is not None else ""
                    if not isinstance(text, str) or len(text) > handoff.MAX_TEXT:
                        return self.json({"error": f"text is a string of at most {handoff.MAX_TEXT} characters"},
                                         status=400)
                    if action == "reply" and not text.strip():
                        return self.json({"error": f"a reply needs its text: expected JSON {EXPECTED}"}, status=400)
                    found = await view_of(app, request, table, conversation_id, settings.partitions)
                    if found is None:
                        return self.json({"error": f"unknown conversation_id {conversation_id!r}"}, status=404)
                    held = found.get("handoff")
                    if action != "handoff" and held is None:
                        return self.json({"error": "the conversation is not held by a person: hand it over first "
                                                   f"(POST /conversations/{conversation_id}/handoff)"}, status=409)
                    record = ConversationAction(
                        conversation_id=conversation_id, agent_name=str(found["agent"]), action=action,  # type: ignore[arg-type]
                        action_id=body.get("action_id") or uuid.uuid4().hex, by=body.get("by") or "http", text=text,
                    )
                    await publish(app, record.agent_name, conversation_id, record.model_dump_json().encode("utf-8"),
                                  retry=f"retry with the same action_id ({record.action_id}), which counts once")
                except Refused as exc:
                    return self.json({"error": str(exc)}, status=exc.status)
                except ValidationError as exc:
                    return self.json({"error": f"expected JSON {EXPECTED}: {exc}"}, status=400)
                return self.json(api.answer(api.ActionAccepted, accepted=True, conversation_id=conversation_id,
                                        action=action, action_id=record.action_id, by=record.by), status=202)

        return Act

    for name in ("handoff", "reply", "handback"):
        app.page(f"/conversations/{{conversation_id}}/{name}")(action_view(name))
    del Inbox
