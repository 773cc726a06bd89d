"""Shared aiohttp plumbing of the HTTP providers: one session each, one map from HTTP outcomes to errors."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp

from agents_stream.config import ProviderConfig
from agents_stream.contract.errors import (
    PermanentError,
    RateLimited,
    ResultTooLarge,
    SystemicError,
    TaskError,
    TransientError,
)
from agents_stream.providers.base import Provider
from agents_stream.providers.sse import Assembly, SSEError, SSEParser

__all__ = ["GATEWAY_RETRY_AFTER", "HTTPProvider", "error_for", "parse_retry_after"]

log = logging.getLogger(__name__)

#: the header a LiteLLM proxy's 429 carries the wait in: the Retry-After of the provider behind it, renamed, and its
#: own rpm limiter's (the proxy sends a plain Retry-After only when all of a model's deployments are cooling down)
GATEWAY_RETRY_AFTER = "llm_provider-retry-after"

#: a probe only asks "is anybody there?"; it must not stall the resume loop
PROBE_TIMEOUT_S = 2.0
_EXCERPT_CHARS = 200


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait per a Retry-After header (seconds or HTTP-date); None if absent or unreadable."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a naive one came without a zone
        when = when.replace(tzinfo=UTC)
    now = now or datetime.now(UTC)
    return max(0.0, (when - now).total_seconds())


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """A 429's own Retry-After; when it names none, the one a gateway forwarded (GATEWAY_RETRY_AFTER)."""
    retry_after = parse_retry_after(headers.get("Retry-After"))
    if retry_after is None:
        retry_after = parse_retry_after(headers.get(GATEWAY_RETRY_AFTER))
    return retry_after


def error_for(
    config: ProviderConfig,
    *,
    status: int | None = None,
    exc: BaseException | None = None,
    headers: Mapping[str, str] | None = None,
    detail: str = "",
    refusal: str | None = None,
) -> TaskError:
    """The one map from an HTTP outcome to the error tree (docs/contract.md, "Error layers").

    ``exc``: no response (timeout, connection error). ``status``: the response's
    code; a 2xx here means its body was unusable (``detail`` says why) or, with
    ``refusal``, that the model declined. ``detail`` is the server's own words.
    """
    name = config.name or config.kind
    said = f" ({detail})" if detail else ""
    error: TaskError
    if exc is not None:
        error = _no_answer(config, name, exc)
    elif refusal is not None:
        error = PermanentError(
            f"{name} refused the prompt ({refusal}): change the prompt; retrying will not help",
            provider=name,
        )
    else:
        error = _status_error(config, name, status, said, headers)
    return _redacted(error, config.api_key())


def _no_answer(config: ProviderConfig, name: str, exc: BaseException) -> TaskError:
    if isinstance(exc, TimeoutError):
        return TransientError(
            f"{name} did not answer within {config.timeout_s:g}s: "
            "retry later, or raise timeout_s if the model is slow",
            provider=name,
        )
    if isinstance(exc, aiohttp.InvalidURL):
        return SystemicError(
            f"{name} has an unusable base_url {config.base_url!r}: fix the provider's configuration",
            provider=name,
        )
    return TransientError(
        f"{name} could not be reached ({type(exc).__name__}: {exc}): "
        "retry later; check base_url if it persists",
        provider=name,
    )


def _status_error(
    config: ProviderConfig, name: str, status: int | None, said: str, headers: Mapping[str, str] | None
) -> TaskError:
    if status is None or 200 <= status < 300:
        return TransientError(
            f"{name} sent a malformed response{said}: retry; report it if it persists",
            provider=name,
        )
    if status == 429:
        retry_after = _retry_after(headers or {})
        when = f"after {retry_after:g}s" if retry_after is not None else "later"
        return RateLimited(
            f"{name} answered 429 (rate limited){said}: retry {when}",
            provider=name,
            retry_after=retry_after,
        )
    if status in (401, 403):
        fix = f"check {config.api_key_env}" if config.api_key_env else "check the endpoint's credentials"
        return SystemicError(f"{name} answered {status}{said}: {fix}", provider=name)
    if status >= 500 or status == 408:
        return TransientError(f"{name} answered {status}{said}: the provider is failing; retry later", provider=name)
    if status == 404:
        return PermanentError(
            f"{name} answered 404{said}: check the model name {config.model!r} and base_url",
            provider=name,
        )
    if 400 <= status < 500:
        return PermanentError(
            f"{name} answered {status}{said}: the request was rejected; fix the prompt or its size",
            provider=name,
        )
    return TransientError(f"{name} answered an unexpected {status}{said}: retry later", provider=name)


def _redacted(error: TaskError, key: str | None) -> TaskError:
    # the server's words or an aiohttp message could echo the key back; never let it travel on
    if key and key in str(error):
        error.args = (str(error).replace(key, "<redacted>"),)
    return error


def _decoded(body: bytes, resp: aiohttp.ClientResponse) -> str:
    """The body as text in the charset the response names (UTF-8 when it names none, or one Python lacks)."""
    try:
        return body.decode(resp.get_encoding(), errors="replace")
    except LookupError:
        return body.decode("utf-8", errors="replace")


def _excerpt(body: str) -> str:
    """The server's own explanation, short: ``error.message`` when JSON, else the start of the body."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            body = err["message"]
        elif isinstance(err, str):
            body = err
    text = " ".join(body.split())
    return text[:_EXCERPT_CHARS] + ("..." if len(text) > _EXCERPT_CHARS else "")


class HTTPProvider(Provider):
    """A provider reached over HTTP: lazy session, one attempt per call, typed errors only."""

    #: used when the configuration leaves ``base_url`` empty
    default_base_url = ""

    def __init__(self, config: ProviderConfig) -> None:
        super().__init__(config)
        self.name = config.name or config.kind
        self.base_url = (config.base_url or self.default_base_url).rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # total= bounds connect + send + read: no call outlives timeout_s. No pool cap (aiohttp's default is 100):
            # the executor's slots and the provider's limit bound calls; one queued for a connection would time out.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.config.timeout_s), connector=aiohttp.TCPConnector(limit=0),
            )
        return self._session

    def _key(self) -> str | None:
        """The API key, or None for key-less endpoints; a named but unset variable is bad config."""
        key = self.config.api_key()
        if key is None and self.config.api_key_env:
            raise SystemicError(
                f"{self.name} needs {self.config.api_key_env}, which is not set: "
                "export it, or take the provider out of the agent's chain",
                provider=self.name,
            )
        return key

    def _probe_url(self) -> str:
        return f"{self.base_url}/"

    def _malformed(self, why: str) -> TaskError:
        return error_for(self.config, status=200, detail=why)

    def _refused(self, reason: str) -> TaskError:
        return error_for(self.config, status=200, refusal=reason)

    async def _post_json(self, url: str, body: dict[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
        """POST once; the parsed JSON object of a 2xx answer, or the error the outcome maps to."""
        started = time.monotonic()
        try:
            async with self._client().post(url, json=body, headers=dict(headers)) as resp:
                status, resp_headers = resp.status, resp.headers
                text = _decoded(await self._read_capped(resp), resp)
        except TimeoutError as exc:
            log.debug("%s POST %s timed out after %.3fs", self.name, url, time.monotonic() - started)
            raise error_for(self.config, exc=exc) from exc
        except aiohttp.ClientError as exc:
            log.debug("%s POST %s failed: %s", self.name, url, type(exc).__name__)
            raise error_for(self.config, exc=exc) from exc
        log.debug("%s POST %s -> %d in %.3fs", self.name, url, status, time.monotonic() - started)
        return self._json_answer(status, resp_headers, text, "body is not JSON")

    def _json_answer(self, status: int, headers: Any, text: str, not_json: str) -> dict[str, Any]:
        """A whole answer: its error for a non-2xx status, else its JSON object (``not_json`` says what else)."""
        if not 200 <= status < 300:
            raise error_for(self.config, status=status, headers=headers, detail=_excerpt(text))
        try:
            data = json.loads(text)
        except ValueError:
            raise self._malformed(not_json) from None
        if not isinstance(data, dict):
            raise self._malformed("body is not a JSON object")
        return data

    async def _post_stream(
        self, url: str, body: dict[str, Any], headers: Mapping[str, str], assembly: Assembly,
    ) -> dict[str, Any] | None:
        """POST once asking for a streamed answer: each Server-Sent Event goes to ``assembly`` as it arrives (its
        ``feed`` says True: the stream is complete, nothing more is read). None once streamed; the parsed JSON
        object when a 2xx answer came whole instead (a gateway that does not stream). Errors as ``_post_json``'s; a
        stream that ends before ``assembly`` is complete is a malformed answer (TransientError: retried). The
        whole stream is bounded by ``timeout_s`` and ``max_body_bytes``."""
        started = time.monotonic()
        try:
            async with self._client().post(url, json=body, headers=dict(headers)) as resp:
                status, resp_headers = resp.status, resp.headers
                if not 200 <= status < 300 or resp.content_type != "text/event-stream":
                    text = _decoded(await self._read_capped(resp), resp)
                else:
                    await self._read_events(resp, assembly)
                    log.debug("%s POST %s streamed in %.3fs", self.name, url, time.monotonic() - started)
                    return None
        except TimeoutError as exc:
            log.debug("%s POST %s timed out after %.3fs", self.name, url, time.monotonic() - started)
            raise error_for(self.config, exc=exc) from exc
        except aiohttp.ClientError as exc:
            log.debug("%s POST %s failed: %s", self.name, url, type(exc).__name__)
            raise error_for(self.config, exc=exc) from exc
        return self._json_answer(status, resp_headers, text,
                                 "a streamed answer that is neither an event stream nor JSON")

    async def _read_events(self, resp: aiohttp.ClientResponse, assembly: Assembly) -> None:
        cap = self.config.max_body_bytes
        parser = SSEParser(max_line=cap)
        size = 0
        async for piece in resp.content.iter_any():
            size += len(piece)
            if size > cap:
                raise self._too_large(size)
            try:
                events = parser.feed(piece)
            except SSEError as exc:
                raise self._malformed(f"not an event stream: {exc}") from None
            for event in events:
                if assembly.feed(event):
                    return
        if not assembly.complete():
            raise self._malformed("the event stream ended before the answer did")

    async def _read_capped(self, resp: aiohttp.ClientResponse) -> bytes:
        """The body, read up to ``max_body_bytes``: a larger one is never held in memory whole (ResultTooLarge)."""
        cap = self.config.max_body_bytes
        if resp.content_length is not None and resp.content_length > cap:
            raise self._too_large(resp.content_length)
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.content.iter_chunked(65536):
            size += len(chunk)
            if size > cap:
                raise self._too_large(size)
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_large(self, size: int) -> ResultTooLarge:
        log.warning(
            "%s sent a response body of at least %d bytes, more than max_body_bytes = %d; the task fails with "
            "result_too_large (raise max_body_bytes in the provider's config if such answers are expected)",
            self.name, size, self.config.max_body_bytes,
        )
        return ResultTooLarge(
            f"result_too_large: {self.name} sent a body of at least {size} bytes > max_body_bytes "
            f"{self.config.max_body_bytes}",
            provider=self.name,
        )

    async def probe(self) -> bool:
        """True when any HTTP answer arrives (even 404): the endpoint is up, whatever it thinks of us."""
        try:
            async with self._client().get(self._probe_url(), timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)):
                return True
        except (TimeoutError, aiohttp.ClientError):
            return False

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()
