"""What the fake LLM keeps of each API call: the request as received, its secrets reduced to "was there a key"."""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from agents_stream.testing.wire import prompt_text

__all__ = ["RecordedRequest", "record_request"]

#: headers never recorded: their values are secrets (only their presence is)
_SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-goog-api-key", "x-api-key", "api-key", "cookie"}
)
_TASK_ID = re.compile(r"task_id=([A-Za-z0-9_.:/#@\-]+)")


@dataclass
class RecordedRequest:
    """One API call as the fake received it; secrets are reduced to "was there a key"."""

    api: str  # gemini | openai | anthropic
    path: str
    url: str  # path and query, with the fake's own api_key (if any) redacted
    model: str
    headers: dict[str, str]
    key_present: bool
    key_header: str | None  # the header the key came in, lower-case
    key_in_url: bool
    body: Any
    instruction: str
    system: str
    task_id: str | None
    ts: float
    status: int | None = None  # what the fake answered, once it has

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def record_request(
    request: web.Request, api: str, model: str, body: Any, api_key: str | None
) -> tuple[RecordedRequest, str | None]:
    """The request's record; the key it carried is returned for checking, never stored."""
    key_header, key = None, None
    for name in ("x-goog-api-key", "authorization", "x-api-key"):
        value = request.headers.get(name)
        if value:
            key_header, key = name, value.removeprefix("Bearer ").strip()
            break
    url = unquote(request.path_qs)
    key_in_url = "key" in request.query or bool(api_key and api_key in url)
    if api_key:
        url = url.replace(api_key, "<redacted>")
    instruction, system, everything = prompt_text(api, body)
    found = _TASK_ID.search(instruction) or _TASK_ID.search(everything)
    record = RecordedRequest(
        api=api,
        path=request.path,
        url=url,
        model=model or (str(body.get("model", "")) if isinstance(body, dict) else ""),
        headers={k: v for k, v in request.headers.items() if k.lower() not in _SECRET_HEADERS},
        key_present=key is not None or "key" in request.query,
        key_header=key_header,
        key_in_url=key_in_url,
        body=body,
        instruction=instruction,
        system=system,
        task_id=found.group(1) if found else None,
        ts=time.time(),
    )
    return record, key
