"""The OpenAPI 3.1 document of the worker's HTTP API, built from the models the views answer with
(agents_stream.ops.api_models) and the event models their bodies become (a body's fields are picked from the
event's own schema), so the document cannot say something the views do not.

Every worker serves it at ``GET /openapi.json`` (no token: it holds no task data, only what the repository's
docs/openapi.json holds; the Host check applies as to the console's files). Regenerate the committed copy with
``python -m agents_stream.ops.openapi > docs/openapi.json`` (tests/unit/ops/test_openapi.py fails while it
differs). ``HEAD`` is left out: Faust answers it on every path as ``GET`` without a body.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

from faust.web import Request, Response, View
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from agents_stream.contract.conversation_messages import ConversationAction, ConversationDelete, ConversationMessage
from agents_stream.contract.models import ApprovalDecision
from agents_stream.ops import api_models as m
from agents_stream.ops.console import ASSETS
from agents_stream.ops.notify import LINK_FIELDS
from agents_stream.orchestrator import JobRequest

__all__ = ["OPERATIONS", "Operation", "document", "register_openapi_view"]

JSON = "application/json"
HTML = "text/html"
#: what each refusal status means, the same on every endpoint
REFUSALS = {
    400: "The request is malformed: a bad parameter or body (the error says which).",
    401: "No valid bearer token for this endpoint.",
    403: "Refused: a request from another site's page (Origin), or a signed link that is forged or expired.",
    404: "No such task, job, conversation, message, dead letter, agent or console file.",
    408: "The body did not arrive within 10 s.",
    409: "The state does not allow it now (the error says why).",
    413: "The body is over 64 KiB.",
    415: "The body is not sent as application/json.",
    421: "The Host header does not name this worker (DNS rebinding check).",
    502: "The worker owning the key did not answer.",
    503: "Retry in a few seconds: a rebalance, a busy worker, or the broker did not confirm.",
}
#: what every route but the probes may answer (the Host check), every read of task data, every mutation
GUARDED = (400, 421)
READ = (401,)
WRITE = (400, 401, 403, 408, 413, 415, 503)


@dataclass(frozen=True)
class Operation:
    """One method on one path: who may call it (``access``), its parameters, body and answers."""

    method: str
    path: str
    summary: str
    tag: str
    #: open (probes, no Host check), page (no token), link (the signature), read, write, conv-read, conv-write
    access: str
    #: the success status and its answer: a model (JSON), or its media types
    ok: tuple[int, type[BaseModel] | tuple[str, ...]]
    refusals: tuple[int, ...] = ()
    query: tuple[tuple[str, dict[str, Any], str], ...] = ()
    body: dict[str, Any] | None = None
    #: answers in another media type than JSON (the signed link's HTML pages)
    media: dict[int, str] = field(default_factory=dict)
    headers: tuple[tuple[str, dict[str, Any], str], ...] = ()
    path_schemas: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: dict[int, type[BaseModel]] = field(default_factory=dict)


def _fields(model: type[BaseModel], names: dict[str, str], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """A JSON object whose properties are ``model``'s own (body name -> field name): the body a view turns into
    that model, described by it."""
    props = model.model_json_schema()["properties"]
    return {"type": "object", "properties": {body: props[own] for body, own in names.items()},
            "required": list(required)}


def _model_body(model: type[BaseModel]) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


STRING = {"type": "string"}
INTEGER = {"type": "integer"}
LIMIT = ("limit", INTEGER, "How many at most (clamped to the endpoint's largest page).")
BY_TEXT_ID = _fields(ConversationAction, {"by": "by", "text": "text", "action_id": "action_id"})


def _action(name: str, what: str) -> Operation:
    return Operation(
        "post", f"/conversations/{{conversation_id}}/{name}", what, "handoff", "write", (202, m.ActionAccepted),
        (*WRITE, 404, 409, 502), body=BY_TEXT_ID,
    )


OPERATIONS: tuple[Operation, ...] = (
    Operation("get", "/healthz", "The process is alive.", "probes", "open", (200, m.Health)),
    Operation("get", "/readyz", "Ready for work (503 while starting or stopping).", "probes", "open", (200, m.Ready),
              extra={503: m.NotReady}),
    Operation("get", "/metrics", "Prometheus text exposition of this worker's numbers.", "probes", "open",
              (200, ("text/plain",))),
    Operation("get", "/openapi.json", "This document.", "console", "page", (200, (JSON,))),
    Operation("get", "/", "The operator console (HTML).", "console", "page", (200, (HTML,))),
    Operation("get", "/console/{name}", "One of the console's static files.", "console", "page",
              (200, tuple(sorted({t.split(";")[0] for t in ASSETS.values()}))), (404,),
              path_schemas={"name": {"type": "string", "enum": sorted(ASSETS)}}),
    Operation("get", "/circuits", "The circuit breakers of every provider.", "reads", "read", (200, m.CircuitsView)),
    Operation("get", "/tasks/{task_id}", "A task's record, from the worker owning it.", "reads", "read",
              (200, m.TaskView), (404, 502, 503)),
    Operation("get", "/jobs/{job_id}", "A job's record (workers running the orchestrator only).", "reads", "read",
              (200, m.JobView), (404, 502, 503)),
    Operation("get", "/recent", "The tasks and jobs whose state changed last, on every worker.", "reads", "read",
              (200, m.RecentView), (400,), query=(LIMIT,)),
    Operation("get", "/samples", "The console's charts: every worker's samples on one time grid.", "reads", "read",
              (200, m.SamplesView)),
    Operation("get", "/approvals", "A page of the tasks awaiting approval on every worker, oldest first.",
              "approvals", "read", (200, m.ApprovalsPage), (400,),
              query=(LIMIT, ("after", STRING, "The `next` of the previous page."))),
    Operation("post", "/approvals/{task_id}", "Decide a parked task (approve, reject) or cancel it.", "approvals",
              "write", (202, m.DecisionAccepted), (*WRITE, 404, 409, 502), body=_fields(
                  ApprovalDecision, {k: k for k in ("decision", "by", "parked", "agent", "comment", "app_id")},
                  ("decision", "by"))),
    Operation("get", "/approvals/{task_id}/{decision}", "The confirmation page of a signed notification link.",
              "approvals", "link", (200, (HTML,)), (403, 409, 502, 503), media={403: HTML, 409: HTML},
              query=tuple((k, STRING, "A field of the signed link.") for k in LINK_FIELDS),
              path_schemas={"decision": {"type": "string", "enum": ["approve", "reject"]}}),
    Operation("post", "/approvals/{task_id}/{decision}", "The signed link's decision (its page's form).",
              "approvals", "link", (202, (HTML,)), (403, 503), media={403: HTML, 503: HTML}, body={
                  "form": {"type": "object", "properties": {k: STRING for k in LINK_FIELDS}}},
              path_schemas={"decision": {"type": "string", "enum": ["approve", "reject"]}}),
    Operation("post", "/tasks/{task_id}/cancel", "Cancel a task (running, parked or not read yet).", "tasks",
              "write", (202, m.TaskCancelAccepted), WRITE, body=_fields(
                  ApprovalDecision, {"by": "by", "reason": "comment", "agent": "agent"})),
    Operation("post", "/jobs/{job_id}/cancel", "Cancel a job.", "jobs", "write", (202, m.JobCancelAccepted), WRITE,
              body=_fields(JobRequest, {"by": "by", "reason": "reason"})),
    Operation("get", "/dlq", "A page of dead letters, newest first.", "dead letters", "read", (200, m.DeadLettersPage),
              (400, 503), query=(*((k, STRING, "A filter, as `agents-stream dlq list` has it.")
                                   for k in ("agent", "layer", "reason", "since", "until")),
                                 LIMIT, ("before", STRING, "The `next` of the previous page."))),
    Operation("get", "/dlq/{ref}", "One dead letter, read at its own offset.", "dead letters", "read",
              (200, m.DeadLetterDetail), (400, 404, 503)),
    Operation("post", "/dlq/requeue", "Send a dead letter back to its agent's task topic.", "dead letters", "write",
              (202, m.Requeued), (*WRITE, 404), body=_model_body(m.DeadLetterRef)),
    Operation("post", "/conversations/{conversation_id}/messages", "A message in (202 once the broker has it).",
              "conversations", "conv-write", (202, m.MessageAccepted), (*WRITE, 404), body=_fields(
                  ConversationMessage, {k: k for k in ("agent_name", "text", "message_id", "context_data", "user")},
                  ("agent_name", "text"))),
    Operation("get", "/conversations/{conversation_id}", "A conversation: status, waiting messages, history.",
              "conversations", "conv-read", (200, m.ConversationView), (400, 404, 502, 503),
              query=(("before", INTEGER, "History items before this one."), LIMIT)),
    Operation("get", "/conversations/{conversation_id}/messages/{message_id}", "A message's round and reply.",
              "conversations", "conv-read", (200, m.MessageView), (404, 502, 503)),
    Operation("get", "/conversations/{conversation_id}/events", "The conversation's progress as Server-Sent Events.",
              "conversations", "conv-read", (200, ("text/event-stream",)), (400, 503),
              query=(("after", INTEGER, "Resume after this event id."),),
              headers=(("Last-Event-ID", INTEGER, "Resume after this event id."),)),
    Operation("post", "/conversations/{conversation_id}/token", "A token that opens this conversation only.",
              "conversations", "write", (200, m.TokenIssued), (*WRITE, 409), body=_model_body(m.ConversationTokenBody)),
    Operation("post", "/conversations/{conversation_id}/delete", "Delete a conversation once no round answers.",
              "conversations", "write", (202, m.ConversationDeleteAccepted), (*WRITE, 404, 502),
              body=_fields(ConversationDelete, {"by": "by"})),
    Operation("get", "/handoffs", "The operators' inbox: conversations held by a person or waiting for one.",
              "handoff", "read", (200, m.HandoffInbox)),
    _action("handoff", "Hand a conversation to a person."),
    _action("reply", "A person's reply in a conversation they hold."),
    _action("handback", "Give a conversation back to its agent."),
    Operation("get", "/desk/{agent}", "The open conversations of one entry point.", "conversations", "read",
              (200, m.DeskView), (404,), query=(("all", {"type": "string", "enum": ["1"]}, "Add idle ones."),)),
)

SECURITY: dict[str, list[dict[str, list[str]]]] = {
    "open": [], "page": [], "link": [],
    "read": [{"read": []}, {"write": []}],
    "write": [{"write": []}],
    "conv-read": [{"read": []}, {"write": []}, {"conversation": []}],
    "conv-write": [{"write": []}, {"conversation": []}],
}
SCHEMES = {
    "read": {"type": "http", "scheme": "bearer", "description": "AGENTS_STREAM_READ_TOKEN: reads only."},
    "write": {"type": "http", "scheme": "bearer",
              "description": "AGENTS_STREAM_API_TOKEN: every read and every mutation."},
    "conversation": {"type": "http", "scheme": "bearer", "description": (
        "A conversation's own token (POST /conversations/{id}/token): that conversation's routes only.")},
}


def _models() -> list[type[BaseModel]]:
    found: dict[str, type[BaseModel]] = {"Error": m.Error}
    for op in OPERATIONS:
        for answer in (op.ok[1], *op.extra.values()):
            if isinstance(answer, type):
                found[answer.__name__] = answer
    found.update({"DeadLetterRef": m.DeadLetterRef, "ConversationTokenBody": m.ConversationTokenBody})
    return [found[name] for name in sorted(found)]


def _response(description: str, media: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": description, "content": {media: {"schema": schema} if schema else {}}}


def _ref(model: type[BaseModel]) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _operation(op: Operation) -> dict[str, Any]:
    status, answer = op.ok
    responses: dict[str, Any] = {str(status): _response("The answer.", JSON, _ref(answer)) if isinstance(answer, type)
                                 else {"description": "The answer.", "content": {t: {} for t in answer}}}
    for code, model in op.extra.items():
        responses[str(code)] = _response(model.__doc__ or "Not ready.", JSON, _ref(model))
    refusals = set(op.refusals)
    if op.access != "open":
        refusals |= set(GUARDED)
    if op.access in ("read", "conv-read"):
        refusals |= set(READ)
    for code in sorted(refusals):
        media = op.media.get(code, JSON)
        responses[str(code)] = _response(REFUSALS[code], media, _ref(m.Error) if media == JSON else None)
    params = [{"name": name, "in": "path", "required": True, "schema": op.path_schemas.get(name, STRING)}
              for name in _path_params(op.path)]
    params += [{"name": n, "in": "query", "required": False, "schema": s, "description": d} for n, s, d in op.query]
    params += [{"name": n, "in": "header", "required": False, "schema": s, "description": d} for n, s, d in op.headers]
    out: dict[str, Any] = {
        "summary": op.summary, "operationId": f"{op.method}_{_slug(op.path)}", "tags": [op.tag],
        "security": SECURITY[op.access], "responses": responses,
    }
    if params:
        out["parameters"] = params
    if op.body is not None:
        media, schema = ("application/x-www-form-urlencoded", op.body["form"]) if "form" in op.body else (JSON, op.body)
        out["requestBody"] = {"required": False, "content": {media: {"schema": schema}}}
    return out


def _path_params(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]


def _slug(path: str) -> str:
    return "_".join(p.strip("{}").replace(".", "_") for p in path.split("/") if p) or "console"


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of every endpoint, as every worker serves it."""
    _, defs = models_json_schema([(model, "serialization") for model in _models()],
                                 ref_template="#/components/schemas/{model}")
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {"title": "agents-stream worker HTTP API", "version": "1", "description": (
            "Every worker serves every endpoint; reads of a key are forwarded to its owner, lists are gathered from "
            "every worker. docs/web.md says what each answer means.")},
        "servers": [{"url": "http://127.0.0.1:6066", "description": "A worker's WEB_PORT."}],
        "components": {"schemas": defs.get("$defs", {}), "securitySchemes": SCHEMES},
        "paths": dict(sorted(paths.items())),
    }


def register_openapi_view(app: Any) -> None:
    """``GET /openapi.json`` on this worker: the document, built once."""
    body = json.dumps(document(), indent=2).encode()

    @app.page("/openapi.json")
    class OpenApi(View):
        async def get(self, request: Request) -> Response:
            return self.bytes(body, content_type=JSON)

    del OpenApi


def main() -> None:
    sys.stdout.write(json.dumps(document(), indent=2) + "\n")


if __name__ == "__main__":
    main()
