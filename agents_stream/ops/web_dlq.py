"""The dead-letter views: ``GET /dlq`` (newest-first pages), ``GET /dlq/<ref>``, ``POST /dlq/requeue``.

Each reads the broker with a consumer of its own, so a worker runs at most ``AGENTS_STREAM_WEB_DLQ_READS`` of
them at once; one more is answered 503 with Retry-After at once instead of queueing behind the others.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from aiokafka.errors import KafkaError
from faust.web import Request, Response, View

from agents_stream.kafka import security as kafka_security
from agents_stream.ops import dlq, dlq_pages
from agents_stream.ops.access import Refused
from agents_stream.ops.bodies import mutation_body
from agents_stream.ops.pages import limit_of
from agents_stream.settings import Settings

__all__ = ["DLQ_LIMIT", "RETRY_AFTER_S", "register_dead_letter_views"]

log = logging.getLogger(__name__)

#: (default, largest) page of GET /dlq
DLQ_LIMIT = (100, 1000)
#: what a refused dead-letter read tells the caller to wait
RETRY_AFTER_S = 2


def _busy(settings: Settings) -> Refused:
    return Refused(503, (
        f"{settings.web_dlq_reads} dead-letter reads are running on this worker "
        f"(AGENTS_STREAM_WEB_DLQ_READS); retry in {RETRY_AFTER_S} s"
    ))


def register_dead_letter_views(app: Any, settings: Settings) -> None:
    """Add the dead-letter views; in this order: the fixed /dlq/requeue before the pattern /dlq/{ref}."""
    security = kafka_security.client_kwargs(settings)
    reads = asyncio.Semaphore(max(1, settings.web_dlq_reads))

    @asynccontextmanager
    async def slot() -> AsyncIterator[None]:
        if reads.locked():
            raise _busy(settings)
        async with reads:
            yield

    def refused(view: View, exc: Refused) -> Response:
        headers = {"Retry-After": str(RETRY_AFTER_S)} if exc.status == 503 else None
        return view.json({"error": str(exc)}, status=exc.status, headers=headers)

    async def one(ref: str) -> dlq.DeadLetter | None:
        topic, partition, offset = dlq.parse_ref(ref)
        async with slot():
            return await dlq_pages.read_one(settings.broker, topic, partition, offset, security=security)

    @app.page("/dlq")
    class DeadLetters(View):
        async def get(self, request: Request) -> Response:
            """A page of dead letters, newest first, filtered like ``agents-stream dlq list``; ``next`` goes on."""
            q = request.query
            try:
                limit = limit_of(q, *DLQ_LIMIT)
                filters = {k: q.get(k) or None for k in ("agent", "layer", "reason", "since", "until")}
                async with slot():
                    names = await dlq.dlq_topics(settings.broker, filters["agent"], timeout=10.0, security=security)
                    page, retained = await dlq_pages.read_page(
                        settings.broker, names, limit=limit, keep=lambda d: dlq.matches(d, **filters),
                        before=q.get("before") or None, security=security,
                    )
            except Refused as exc:
                return refused(self, exc)
            except ValueError as exc:
                return self.json({"error": f"bad parameter: {exc}"}, status=400)
            except Exception as exc:  # the broker did not answer in time: say so, the console retries
                error = f"reading the dead-letter topics failed: {type(exc).__name__}: {exc}"
                return self.json({"error": error}, status=503, headers={"Retry-After": str(RETRY_AFTER_S)})
            return self.json({
                "dead_letters": [dlq.summary(d) for d in page.letters], "count": len(page.letters),
                "next": page.next, "scanned": page.scanned, "retained": retained, "total": sum(retained.values()),
            })

    @app.page("/dlq/requeue")
    class Requeue(View):
        async def post(self, request: Request) -> Response:
            """Send one dead letter back to its task topic (body: ``{"ref"}`` or topic, partition, offset)."""
            try:
                body = await mutation_body(settings, request)
                ref = str(body.get("ref") or f"{body.get('topic')}:{body.get('partition')}:{body.get('offset')}")
                found = await one(ref)
                if not found:
                    return self.json({"error": f"no dead letter {ref}"}, status=404)
                (record, requeue_id), = await dlq.requeue(settings.broker, [found], timeout=20.0, security=security)
            except Refused as exc:
                return refused(self, exc)
            except ValueError as exc:
                return self.json({"error": str(exc)}, status=400)
            except (asyncio.TimeoutError, TimeoutError, KafkaError) as exc:
                error = (
                    f"the broker did not answer ({type(exc).__name__}); the requeue may or may not have been sent: "
                    "look the task up before retrying"
                )
                return self.json({"error": error}, status=503)
            log.info("Dead letter %s (task %s) requeued over HTTP as %s", ref, record.task_id, requeue_id)
            return self.json({"requeued": {**dlq.summary(record), "requeue_id": requeue_id}}, status=202)

    @app.page("/dlq/{ref}")
    class DeadLetterView(View):
        async def get(self, request: Request, ref: str) -> Response:
            """One dead letter, read at its own offset."""
            try:
                found = await one(ref)
            except Refused as exc:
                return refused(self, exc)
            except ValueError as exc:
                return self.json({"error": str(exc)}, status=400)
            except (asyncio.TimeoutError, TimeoutError, KafkaError) as exc:
                error = f"reading the dead letter failed ({type(exc).__name__}); retry"
                return self.json({"error": error}, status=503, headers={"Retry-After": str(RETRY_AFTER_S)})
            if not found:
                return self.json({"error": f"no dead letter {ref}"}, status=404)
            return self.json(found.as_dict())
