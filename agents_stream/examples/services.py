"""Fake carrier, payment, mail, order and account services for the refund saga, the support agent and the billing
agent: real HTTP, idempotent by key, recording calls.

    async with FakeServices() as services:
        services.fail("payment.refund", times=1)      # the next refund call answers 503
        ...
        services.executed("carrier.label")            # idempotency keys that had an effect

A call repeats the first answer for an idempotency key it already executed and
records it as a replay, as a well-behaved payment API does.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from agents_stream import ToolContext, ToolError, TransientError

OPERATIONS = (
    "carrier.label", "carrier.cancel_label", "payment.refund", "mail.send", "orders.update", "orders.lookup",
    "payment.charge", "accounts.lookup",
)


@dataclass
class Call:
    operation: str
    key: str
    replay: bool  # the key had been executed before: no effect this time
    failed: bool
    at: float
    body: Any = None  # the request's JSON (what was charged to whom)


class FakeServices:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host, self.port = host, port
        self.calls: list[Call] = []
        self._done: dict[tuple[str, str], dict[str, Any]] = {}
        #: the highest fencing token seen per resource (a task): a lower one is a worker the task moved on from
        self._tokens: dict[str, int] = {}
        self._failures: dict[str, int] = {}
        self._delays: dict[str, float] = {}
        self._notes_bytes = 0  # orders.lookup answers carry this many bytes of notes (a huge tool output)
        self._wake = asyncio.Event()  # ends the delays in progress (delay(op, 0), stop)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def fail(self, operation: str, times: int = 1) -> None:
        """The next ``times`` calls of ``operation`` answer 503 (and have no effect)."""
        self._failures[operation] = self._failures.get(operation, 0) + times

    def delay(self, operation: str, seconds: float) -> None:
        """Calls of ``operation`` take effect at once but answer ``seconds`` later (a slow service); 0 ends the
        delays in progress too."""
        self._delays[operation] = seconds
        if not seconds:
            self._wake.set()
            self._wake = asyncio.Event()

    def pad_orders(self, size: int) -> None:
        """Orders looked up from now on carry ``size`` bytes of notes."""
        self._notes_bytes = size

    def effects(self, operation: str, field: str) -> dict[Any, list[str]]:
        """The keys whose call of ``operation`` had an effect, by the request's ``field`` (charges per account)."""
        out: dict[Any, list[str]] = {}
        for c in self.calls:
            if c.operation == operation and not c.replay and not c.failed:
                out.setdefault((c.body or {}).get(field), []).append(c.key)
        return out

    def executed(self, operation: str) -> list[str]:
        """Keys whose call of ``operation`` had an effect, in order (a key twice here would be a double effect)."""
        return [c.key for c in self.calls if c.operation == operation and not c.replay and not c.failed]

    async def start(self) -> FakeServices:
        app = web.Application()
        app.add_routes([web.post("/{service}/{op}", self._call)])
        self._runner = web.AppRunner(app, access_log=None)
        await asyncio.wait_for(self._runner.setup(), 5)
        site = web.TCPSite(self._runner, self.host, self.port)
        await asyncio.wait_for(site.start(), 5)
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        self._wake.set()
        if self._runner is not None:
            await asyncio.wait_for(self._runner.cleanup(), 5)
            self._runner = None

    async def __aenter__(self) -> FakeServices:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _call(self, request: web.Request) -> web.Response:
        operation = f"{request.match_info['service']}.{request.match_info['op']}"
        key = request.headers.get("Idempotency-Key", "")
        if operation not in OPERATIONS or not key:
            return web.json_response({"error": f"unknown operation {operation!r} or no Idempotency-Key"}, status=400)
        body = await request.json() if request.can_read_body else {}
        if (operation, key) in self._done:
            self.calls.append(Call(operation, key, True, False, time.time()))
            return web.json_response(self._done[(operation, key)])
        stale = _stale(self._tokens, request.headers)
        if stale is not None:
            self.calls.append(Call(operation, key, False, True, time.time()))
            return web.json_response({"error": stale}, status=409)
        if self._failures.get(operation, 0) > 0:
            self._failures[operation] -= 1
            self.calls.append(Call(operation, key, False, True, time.time()))
            return web.json_response({"error": f"{operation} is unavailable (scripted)"}, status=503)
        answer = {"operation": operation, "key": key, "id": f"{operation}-{len(self._done) + 1}", "request": body}
        if operation == "orders.lookup":  # every order exists, delivered, for 42.50
            answer["order"] = {"order_id": body.get("order_id"), "amount": 42.5, "email": "customer@example.com",
                               "status": "delivered", "notes": "n" * self._notes_bytes}
        if operation == "accounts.lookup":  # every account exists and owes 42.50
            answer["account"] = {"account": body.get("account"), "owes": 42.5}
        self._done[(operation, key)] = answer
        self.calls.append(Call(operation, key, False, False, time.time(), body))
        if self._delays.get(operation):
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self._delays[operation])
            except asyncio.TimeoutError:
                pass
        return web.json_response(answer)


def _stale(tokens: dict[str, int], headers: Any) -> str | None:
    """Why a call's fencing token is refused (lower than one seen for its resource), or None (recorded as seen).
    A call without the two headers is not fenced."""
    resource, token = headers.get("Fencing-Resource"), headers.get("Fencing-Token")
    if not resource or not token or not token.isdigit():
        return None
    highest = tokens.get(resource, 0)
    if int(token) < highest:
        return f"stale fencing token {token} for {resource}: {highest} was seen (the task moved to another worker)"
    tokens[resource] = int(token)
    return None


async def call_service(
    operation: str, key: str, body: dict[str, Any], fencing: tuple[str, int] | None = None,
) -> tuple[int, Any]:
    """POST ``operation`` ("payment.refund") to the services at ``AGENTS_STREAM_REFUND_SERVICES`` with its
    idempotency key: (HTTP status, JSON answer). What the saga steps and the support agent's tools call.
    ``fencing``: (resource, token), sent as ``Fencing-Resource`` and ``Fencing-Token`` (the task and its dispatch
    number: the services refuse a token lower than one they saw for the task)."""
    base = os.environ.get("AGENTS_STREAM_REFUND_SERVICES", "http://127.0.0.1:8090").rstrip("/")
    service, op = operation.split(".")
    headers = {"Idempotency-Key": key}
    if fencing is not None:
        headers.update({"Fencing-Resource": fencing[0], "Fencing-Token": str(fencing[1])})
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        async with session.post(f"{base}/{service}/{op}", json=body, headers=headers) as resp:
            return resp.status, await resp.json(content_type=None)


async def tool_call(operation: str, ctx: ToolContext, body: dict[str, Any]) -> Any:
    """``operation`` from a tool, with the call's idempotency key and fencing token: its JSON answer. A 5xx or 429 is
    retried with the same key (TransientError); another refusal is told to the model (ToolError)."""
    status, data = await call_service(operation, ctx.key, body, (ctx.task.task_id, ctx.fencing_token))
    if status >= 500 or status == 429:
        raise TransientError(f"{operation} answered {status}")
    if status >= 400:
        raise ToolError(f"{operation} refused: {data}")
    return data


async def serve(port: int) -> None:
    """Run the services on ``port`` until SIGINT or SIGTERM (``python -m agents_stream.examples.services``)."""
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with FakeServices(port=port) as services:
        print(f"example services on {services.url}: POST /<service>/<op> with an Idempotency-Key", flush=True)
        await stop.wait()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="the fake carrier, payment, mail and order services")
    parser.add_argument("--port", type=int, default=8090)
    asyncio.run(serve(parser.parse_args().port))
