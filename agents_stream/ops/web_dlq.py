"""The dead-letter views: ``GET /dlq`` (newest-first pages), ``GET /dlq/<ref>``, ``POST /dlq/requeue``.

Each reads the broker with a consumer of its own, so a worker runs at most ``AGENTS_STREAM_WEB_DLQ_READS`` of
them at once; one more is answered 503 with Retry-After at once instead of queueing behind the others.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Mapping

from aiokafka.errors import KafkaError
from faust.web import Request, Response, View

from agents_stream.kafka import security as kafka_security
from agents_stream.ops import api_models as api
from agents_stream.ops import dlq, dlq_pages
from agents_stream.ops.access import Refused
from agents_stream.ops.bodies import mutation_body
from agents_stream.ops.pages import limit_of
from agents_stream.settings import Settings

__all__ = ["DLQ_LIMIT", "RETRY_AFTER_S", "DeadLetterReads", "register_dead_letter_views"]

log = logging.getLogger(__name__)

#: (default, largest) page of GET /dlq
DLQ_LIMIT = (100, 1000)
#: what a refused dead-letter read tells the caller to wait
RETRY_AFTER_S = 2
FILTERS = ("agent", "layer", "reason", "since", "until")


class DeadLetterReads:
    """The dead-letter reads of one worker, at most ``AGENTS_STREAM_WEB_DLQ_READS`` at once."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.security = kafka_security.client_kwargs(settings)
        self.reads = asyncio.Semaphore(max(1, settings.web_dlq_reads))

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """A read slot, or Refused 503 at once when every one is taken (no queue to pile up behind)."""
        if self.reads.locked():
            raise Refused(503, (
                f"{self.settings.web_dlq_reads} dead-letter reads are running on this worker "
                f"(AGENTS_STREAM_WEB_DLQ_READS); retry in {RETRY_AFTER_S} s"
            ))
        async with self.reads:
            yield

    async def one(self, ref: str) -> dlq.DeadLetter | None:
        """The dead letter ``ref``, read at its own offset; ValueError for a malformed ref."""
        topic, partition, offset = dlq.parse_ref(ref)
        async with self.slot():
            return await dlq_pages.read_one(self.settings.broker, topic, partition, offset, security=self.security)

    async def page(self, query: Mapping[str, str]) -> dict[str, Any]:
        """The body of ``GET /dlq``; ValueError for a bad parameter."""
        limit = limit_of(query, *DLQ_LIMIT)
        filters = {k: query.get(k) or None for k in FILTERS}
        broker, security = self.settings.broker, self.security
        async with self.slot():
            names = await dlq.dlq_topics(broker, filters["agent"], timeout=10.0, security=security)
            page, retained = await dlq_pages.read_page(
                broker, names, limit=limit, keep=lambda d: dlq.matches(d, **filters),
                before=query.get("before") or None, security=security,
            )
        return {
            "dead_letters": [dlq.summary(d) for d in page.letters], "count": len(page.letters),
            "next": page.next, "scanned": page.scanned, "retained": retained, "total": sum(retained.values()),
        }


def _error(view: View, status: int, error: str) -> Response:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    return view.json({"error": error}, status=status, headers=headers)


def register_dead_letter_views(app: Any, settings: Settings) -> None:
    """Add the dead-letter views; in this order: the fixed /dlq/requeue before the pattern /dlq/{ref}."""
    reads = DeadLetterReads(settings)

    @app.page("/dlq")
    class DeadLetters(View):
        async def get(self, request: Request) -> Response:
            """A page of dead letters, newest first, filtered like ``agents-stream dlq list``; ``next`` goes on."""
            try:
                return self.json(api.answer(api.DeadLettersPage, **await reads.page(request.query)))
            except Refused as exc:
                return _error(self, exc.status, str(exc))
            except ValueError as exc:
                return self.json({"error": f"bad parameter: {exc}"}, status=400)
            except Exception as exc:  # the broker did not answer in time: say so, the console retries
                return _error(self, 503, f"reading the dead-letter topics failed: {type(exc).__name__}: {exc}")

    _requeue_view(app, settings, reads)

    @app.page("/dlq/{ref}")
    class DeadLetterView(View):
        async def get(self, request: Request, ref: str) -> Response:
            """One dead letter, read at its own offset."""
            try:
                found = await reads.one(ref)
            except Refused as exc:
                return _error(self, exc.status, str(exc))
            except ValueError as exc:
                return self.json({"error": str(exc)}, status=400)
            except (asyncio.TimeoutError, TimeoutError, KafkaError) as exc:
                return _error(self, 503, f"reading the dead letter failed ({type(exc).__name__}); retry")
            if not found:
                return self.json({"error": f"no dead letter {ref}"}, status=404)
            return self.json(api.answer(api.DeadLetterDetail, **found.as_dict()))


def _requeue_view(app: Any, settings: Settings, reads: DeadLetterReads) -> None:
    @app.page("/dlq/requeue")
    class Requeue(View):
        async def post(self, request: Request) -> Response:
            """Send one dead letter back to its task topic (body: ``{"ref"}`` or topic, partition, offset)."""
            try:
                body = await mutation_body(settings, request)
                ref = api.DeadLetterRef.model_validate(body).as_ref()
                found = await reads.one(ref)
                if not found:
                    return self.json({"error": f"no dead letter {ref}"}, status=404)
                (record, requeue_id), = await dlq.requeue(
                    settings.broker, [found], timeout=20.0, security=reads.security,
                )
            except Refused as exc:
                return _error(self, exc.status, str(exc))
            except ValueError as exc:
                return self.json({"error": str(exc)}, status=400)
            except (asyncio.TimeoutError, TimeoutError, KafkaError) as exc:
                error = (
                    f"the broker did not answer ({type(exc).__name__}); the requeue may or may not have been sent: "
                    "look the task up before retrying"
                )
                return self.json({"error": error}, status=503)
            log.info("Dead letter %s (task %s) requeued over HTTP as %s", ref, record.task_id, requeue_id)
            requeued = {**dlq.summary(record), "requeue_id": requeue_id}
            return self.json(api.answer(api.Requeued, requeued=requeued), status=202)
