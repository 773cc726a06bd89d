"""The changelog-backed tables of one app: defined once, passed to whoever reads or writes them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import faust

from agents_stream.settings import Settings


class LedgerTable(faust.Table):
    """A Table that keeps the future of its last changelog send, so the ledger can await durability.

    Faust sends changelog records fire-and-forget (FAUST-NOTES.md "Tables"). Its ``on_key_set`` and
    ``on_key_del`` call ``send_changelog`` directly (not ``_send_changelog``), so that is where the future
    is caught: one changelog record per table write, the one the ledger awaits.
    """

    last_changelog: Any = None

    def send_changelog(
        self, partition: Any, key: Any, value: Any, key_serializer: Any = None, value_serializer: Any = None,
    ) -> Any:
        self.last_changelog = super().send_changelog(partition, key, value, key_serializer, value_serializer)
        return self.last_changelog


    def scan(self, partition: int, after: bytes | None, limit: int) -> tuple[list[tuple[str, Any]], bytes | None]:
        """Up to ``limit`` entries of one partition's local store after the key ``after``, in key order, decoded;
        and the key to go on from (None once the partition's end is reached).

        Faust's own iteration walks every active partition from its start; the expiry sweep reads a slice at a
        time instead. Faust 0.15.3's RocksDB store keeps one rocksdict database per partition (``_dbs``); this is
        the one place that reads it. A partition this worker has no database for (revoked) gives nothing.
        """
        store = self.data
        db = getattr(store, "_dbs", {}).get(partition)
        if db is None:
            return [], None
        skip = getattr(store, "offset_key", None)
        entries: list[tuple[str, Any]] = []
        for raw_key, raw_value in (db.items(from_key=after) if after is not None else db.items()):
            if raw_key == after or raw_key == skip:
                continue
            if len(entries) == limit:
                return entries, after
            after = raw_key
            try:
                key = json.loads(raw_key)  # Faust stores a str key as JSON (b'"task-1"'), whatever the schema says
                if isinstance(key, str):
                    entries.append((key, json.loads(raw_value)))
            except ValueError:  # UnicodeDecodeError included
                continue  # not an entry this app wrote: left alone
        return entries, None


class PromptTableManager(faust.tables.TableManager):
    """Faust's table manager without the second it sleeps before it registers the tables.

    Faust waits 1 s at start in case tables are still being declared (by agents as they start). Every table
    of this app is declared by ``define_tables`` before the worker starts, and Faust refuses one declared later
    ("Too late to add tables"), so the second is only a delay: it was about a fifth of a worker's start here,
    and every start (a restart, a scale-out, a failover) paid it.
    """

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


@dataclass(frozen=True)
class Tables:
    """Every table of the app. The ledger agent is the only writer of each (DESIGN.md "One writer per table")."""

    tasks: LedgerTable  # task_id → TaskRecord JSON, plus poison markers and spend (agents_stream.tables.leases)
    answers: LedgerTable  # task fingerprint → the last good answer (the cache tier)
    jobs: LedgerTable  # job_id → JobRecord JSON (agents_stream.tables.jobs)
    timers: LedgerTable  # parked tasks and running jobs: what the scanner watches

    def all(self) -> list[LedgerTable]:
        return [self.tasks, self.answers, self.jobs, self.timers]


def _table(app: faust.App, settings: Settings, name: str, help: str) -> LedgerTable:
    """A table the ledger owns: str keys, plain versioned JSON values (never pickled), RocksDB via rocksdict."""
    table = LedgerTable(
        app,
        name=name,
        default=None,
        partitions=settings.partitions,
        schema=faust.Schema(key_type=str, key_serializer="raw", value_serializer="json"),
        beacon=app.tables.beacon,
        help=help,
        options={
            "driver": "rocksdict",
            "block_cache_size": settings.rocksdb_cache_mb * 1024 * 1024,
            "write_buffer_size": 4 * 1024 * 1024,
            "max_write_buffer_number": 2,
        },
    )
    app.tables.add(table)  # returns the table it was given
    return table


def define_tables(app: faust.App, settings: Settings) -> Tables:
    """Add the app's tables to ``app`` (Faust recovers them at start) and return them."""
    return Tables(
        tasks=_table(app, settings, "tasks", "Task ledger: idempotency, leases and stored results, keyed by task_id."),
        answers=_table(
            app, settings, "answers",
            "Last good answer per task fingerprint (agent + instruction + context), for the cache tier.",
        ),
        jobs=_table(app, settings, "jobs", "Jobs: plan, each step's status and output, the stored job result."),
        timers=_table(
            app, settings, "timers",
            "Tasks awaiting approval or running after one, and running jobs: what the scanner watches.",
        ),
    )
