"""The conversation views: ``POST /conversations/<id>/messages`` (a message in, 202 once the broker has it) and
``GET /conversations/<id>`` (its status, messages and replies, answered by the worker owning it). Schemas:
docs/conversations.md, "HTTP"."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from aiokafka.errors import KafkaError
from faust.web import Request, Response, View
from pydantic import ValidationError

from agents_stream.contract import topics
from agents_stream.contract.conversation_messages import ConversationDelete, ConversationMessage, round_task_id
from agents_stream.ops import api_models as api
from agents_stream.ops import conversation_tokens
from agents_stream.ops.access import Refused
from agents_stream.ops.bodies import mutation_body
from agents_stream.ops.routing import ask_owner, owner_elsewhere, routed
from agents_stream.tables import conversations as machine
from agents_stream.tables import handoff
from agents_stream.tables.conversations import ConversationRecord, summary_key
from agents_stream.tables.leases import TaskRecord

if TYPE_CHECKING:
    from agents_stream.ops.web import Worker

__all__ = ["describe", "publish", "register_conversation_views", "view_of"]

EXPECTED = (
    '{"agent_name": "<agent>", "text": "<the message>", "message_id": "<optional: your id, so a retry is the same '
    'message>", "context_data": {<optional>}, "user": "<optional: who wrote it>"}'
)
#: how long a message's send may wait for the broker's acknowledgement
SEND_TIMEOUT_S = 15.0
#: history items a page of GET /conversations/<id> shows by default, and at most
HISTORY_PAGE = 50
MAX_HISTORY_PAGE = 500


def describe(
    cid: str, data: dict[str, Any], read: Any, tasks: Any, partitions: int, *, before: int | None, limit: int,
) -> dict[str, Any]:
    """A conversation as ``GET /conversations/<id>`` shows it: status, the messages waiting for a round, and a
    page of its history (the last ``limit`` items before item ``before``; ``next`` pages further back)."""
    head = ConversationRecord.from_json(data)
    items = machine.page(head, read, cid, before=before, limit=limit)
    body: dict[str, Any] = {
        "conversation_id": cid,
        "agent": head.agent,
        "status": head.status,
        "rounds": head.rounds,
        "messages": head.messages,
        "items": head.items,
        "history": items,
        "next": items[0]["i"] if items and items[0]["i"] > 0 else None,
        "waiting": [{k: m.get(k) for k in ("id", "text", "user", "at", "round")} for m in head.waiting_list()],
        "round": None,
        "summary": _summary(read(summary_key(cid))),
        "handoff": handoff.inbox_entry(cid, head, time.time()) if head.held_by is not None else None,
    }
    if head.answering is not None:
        task_id = round_task_id(cid, head.answering, partitions, head.since)
        stored = tasks.get(task_id)
        state = TaskRecord.from_json(stored).state if stored else "starting"
        body["round"] = {"round": head.answering, "task_id": task_id, "state": state}
        if state == "awaiting_approval":
            body["status"] = "waiting_for_approval"
        elif state == "awaiting_subtasks":
            body["status"] = "waiting_for_subagents"
    return body


def _summary(stored: Any) -> dict[str, Any] | None:
    """The summary of the conversation's older history as the model is shown it (``[agents.<name>.summary]``):
    its text, the first history item it does not cover (``upto``), and the round that wrote it."""
    if not stored:
        return None
    return {k: stored.get(k) for k in ("text", "upto", "round", "at")}


def register_conversation_views(app: Any, runtime: Worker) -> None:
    settings = runtime.settings
    table = runtime.tables.conversations

    @app.page("/conversations/{conversation_id}/messages")
    class Post(View):
        async def post(self, request: Request, conversation_id: str) -> Response:
            try:
                body = await mutation_body(settings, request)
            except Refused as exc:
                return self.json({"error": str(exc)}, status=exc.status)
            try:
                message = ConversationMessage.model_validate({
                    "conversation_id": conversation_id, "message_id": body.get("message_id") or uuid.uuid4().hex,
                    "agent_name": body.get("agent_name"), "text": body.get("text"),
                    "context_data": body.get("context_data") or {}, "user": body.get("user"),
                })
            except ValidationError as exc:
                return self.json({"error": f"expected JSON {EXPECTED}: {exc}"}, status=400)
            if message.agent_name not in runtime.agents:
                return self.json({"error": f"agent {message.agent_name!r} is not run by this app; it runs "
                                           f"{sorted(runtime.agents)}"}, status=404)
            try:
                partition, offset = await _send(app, message)
            except Refused as exc:
                return self.json({"error": str(exc)}, status=exc.status)
            return self.json(api.answer(
                api.MessageAccepted, accepted=True, conversation_id=conversation_id, message_id=message.message_id,
                partition=partition, offset=offset,
            ), status=202)

    @app.page("/conversations/{conversation_id}")
    @routed(app, table, "conversation_id", settings.partitions)
    async def conversation(self: View, request: Request, conversation_id: str) -> Response:
        data = table.get(conversation_id)
        if not data:
            return self.json({"error": f"unknown conversation_id {conversation_id!r}"}, status=404)
        try:
            before = int(request.query["before"]) if request.query.get("before") else None
            limit = min(max(int(request.query.get("limit") or HISTORY_PAGE), 1), MAX_HISTORY_PAGE)
        except ValueError:
            return self.json({"error": "before and limit must be integers"}, status=400)
        return self.json(api.answer(api.ConversationView, **describe(
            conversation_id, data, table.get, runtime.tables.tasks, settings.partitions, before=before, limit=limit)))

    @app.page("/conversations/{conversation_id}/messages/{message_id}")
    @routed(app, table, "conversation_id", settings.partitions)
    async def message(self: View, request: Request, conversation_id: str, message_id: str) -> Response:
        found = machine.message_view(table.get, conversation_id, message_id)
        if found is None:
            return self.json({"error": f"no message {message_id!r} in conversation {conversation_id!r} (yet)"},
                             status=404)
        return self.json(api.answer(api.MessageView, conversation_id=conversation_id, **found))

    @app.page("/conversations/{conversation_id}/delete")
    class Delete(View):
        async def post(self, request: Request, conversation_id: str) -> Response:
            try:
                body = await mutation_body(settings, request)
                agent = await _agent_of(app, request, table, conversation_id, settings.partitions)
                if agent is None:
                    return self.json({"error": f"unknown conversation_id {conversation_id!r}"}, status=404)
                delete = ConversationDelete(conversation_id=conversation_id, agent_name=agent, action="delete",
                                            by=body.get("by") or "http")
            except Refused as exc:
                return self.json({"error": str(exc)}, status=exc.status)
            except ValidationError as exc:
                return self.json({"error": f'expected JSON {{"by": "<who>"}}: {exc}'}, status=400)
            try:
                await _publish(app, delete.agent_name, conversation_id, delete.model_dump_json().encode("utf-8"))
            except Refused as exc:
                return self.json({"error": str(exc)}, status=exc.status)
            return self.json(api.answer(api.ConversationDeleteAccepted, accepted=True, conversation_id=conversation_id,
                                    by=delete.by), status=202)

    @app.page("/conversations/{conversation_id}/token")
    class Token(View):
        async def post(self, request: Request, conversation_id: str) -> Response:
            try:
                body = await mutation_body(settings, request)
                ttl = api.ConversationTokenBody.model_validate(body).ttl_s or 3600.0
            except Refused as exc:
                return self.json({"error": str(exc)}, status=exc.status)
            except ValidationError as exc:
                return self.json({"error": f'expected JSON {{"ttl_s": <seconds>}}: {exc}'}, status=400)
            if not settings.conversation_secret:
                return self.json({"error": "no AGENTS_STREAM_CONVERSATION_SECRET is set on the workers: no "
                                           "conversation tokens can be issued"}, status=409)
            token, expires = conversation_tokens.issue(settings.conversation_secret, conversation_id, ttl,
                                                       time.time())
            return self.json(api.answer(api.TokenIssued, conversation_id=conversation_id, token=token,
                                        expires_at=expires))

    del Post, conversation, message, Delete, Token  # registered on the app


async def _agent_of(app: Any, request: Request, table: Any, cid: str, partitions: int) -> str | None:
    """The conversation's agent, read where the conversation is (this worker or its owner); None if unknown."""
    found = await view_of(app, request, table, cid, partitions)
    return str(found["agent"]) if found is not None else None


async def view_of(app: Any, request: Request, table: Any, cid: str, partitions: int) -> dict[str, Any] | None:
    """The conversation's head as ``GET /conversations/<id>?limit=1`` shows it (agent, status, ``handoff``), read
    where the conversation is (this worker or its owner); None if unknown."""
    owner = owner_elsewhere(app, table, cid, partitions, request)
    if owner is None:
        data = table.get(cid)
        if not data:
            return None
        head = ConversationRecord.from_json(data)
        return {"agent": head.agent, "status": head.status,
                "handoff": handoff.inbox_entry(cid, head, time.time()) if head.held_by is not None else None}
    status, _, body = await ask_owner(app, owner, request, path=f"/conversations/{quote(cid, safe='')}?limit=1")
    if status == 404:
        return None
    try:
        if status != 200:
            raise ValueError(f"HTTP {status}")
        found = json.loads(body)
        str(found["agent"])
        return dict(found)
    except (ValueError, KeyError, TypeError) as exc:
        raise Refused(502, f"the worker owning this conversation ({owner}) answered {exc}") from None


async def publish(app: Any, agent: str, cid: str, value: bytes, retry: str = "retry") -> tuple[int, int]:
    """One record on the agent's task topic keyed by the conversation (an operator's action too)."""
    return await _publish(app, agent, cid, value, retry)


async def _send(app: Any, message: ConversationMessage) -> tuple[int, int]:
    """Publish the message on its agent's task topic, keyed by its conversation; (partition, offset) once the
    broker confirmed it. A send that was not confirmed may still land: the same message_id again is harmless."""
    value = message.model_dump_json(exclude_none=True).encode("utf-8")
    return await _publish(app, message.agent_name, message.conversation_id, value, retry=(
        f"retry with the same message_id ({message.message_id}), which is answered once"))


async def _publish(app: Any, agent: str, cid: str, value: bytes, retry: str = "retry") -> tuple[int, int]:
    """One record on the agent's task topic keyed by the conversation, once the broker confirmed it."""
    channel = app.topic(topics.task_topic(agent), key_serializer="raw", value_serializer="raw")

    async def send() -> Any:
        fut = await channel.send(key=cid.encode("utf-8"), value=value)
        return await fut

    try:
        metadata = await asyncio.wait_for(send(), timeout=SEND_TIMEOUT_S)
    except (asyncio.TimeoutError, KafkaError) as exc:
        raise Refused(
            503, f"the broker did not confirm the record ({type(exc).__name__}); it may have been sent: {retry}",
        ) from None
    return metadata.partition, metadata.offset
