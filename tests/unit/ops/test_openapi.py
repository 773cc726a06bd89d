"""The OpenAPI document (agents_stream.ops.openapi): the committed docs/openapi.json is the generated one, and it
names exactly the routes the real worker's web server registers."""

from __future__ import annotations

import json
from pathlib import Path

from agents_stream.ops import openapi
from agents_stream.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "docs" / "openapi.json"
REGENERATE = "python -m agents_stream.ops.openapi > docs/openapi.json"


def test_the_committed_document_is_the_generated_one() -> None:
    """A view's answer model or an endpoint changed without docs/openapi.json: clients would generate from a
    stale document."""
    generated = openapi.document()
    committed = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert committed == generated, f"docs/openapi.json is stale: run `{REGENERATE}` and commit it"
    assert COMMITTED.read_text(encoding="utf-8") == json.dumps(generated, indent=2) + "\n", REGENERATE


def test_every_route_of_the_real_web_server_is_documented_and_nothing_else() -> None:
    """Walk the routes a worker built by build_app registers (every view, the job view too) against the document's
    operations; HEAD, which Faust adds to every path, is left out of both."""
    from agents_stream.app import build_app

    app = build_app(Settings.from_env({"AGENTS_STREAM_API_TOKEN": "w", "AGENTS_STREAM_JOBS": "1"}))
    served = {
        (route.method.lower(), route.resource.canonical)
        for route in app.web.web_app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    documented = {(method, path) for path, ops in openapi.document()["paths"].items() for method in ops}
    assert ("get", "/openapi.json") in served
    assert served - documented == set(), "served but not in the document"
    assert documented - served == set(), "in the document but not served"


def test_every_operation_says_who_may_call_it_and_how_it_is_refused() -> None:
    """Reads of task data name the read and write tokens and answer 401; mutations need the write token and list
    the refusals every mutation gives; the probes need nothing."""
    doc = openapi.document()
    assert set(doc["components"]["securitySchemes"]) == {"read", "write", "conversation"}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            codes = set(op["responses"])
            if path in ("/healthz", "/readyz", "/metrics"):
                assert op["security"] == [] and "421" not in codes, path
                continue
            assert "421" in codes, (method, path)
            if method == "post" and op["security"]:
                assert {"write": []} in op["security"], (method, path)
                assert {"400", "401", "403", "413", "415"} <= codes, (method, path)
                assert "requestBody" in op, (method, path)
            if method == "get" and op["security"]:
                assert {"read": []} in op["security"] and "401" in codes, (method, path)
    approvals = doc["paths"]["/approvals/{task_id}"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert approvals["properties"]["decision"]["enum"] == ["approve", "reject", "cancel"]  # ApprovalDecision's own
