"""Who is in the group: the worker ids of its members, as the group's coordinator describes them after a rebalance.

A task's lease names the worker that runs it. When that worker is not a member of the group any more (it died, or
was cut off or paused past its session and expelled), the partition's new owner need not wait out the lease: a
worker outside the group can no longer act for the partition (docs/security.md, "Fencing"), so its tasks are taken
over at once. Each worker's consumer announces its worker id as its Kafka client id (``client_id``).

With static membership (``AGENTS_STREAM_INSTANCE_ID``) a restarted process takes its predecessor's place in the
group without a rebalance, and the coordinator keeps describing the member with the client id it first joined
with. So a worker id then starts with the instance id (``<instance>@<host>:<pid>:<random>``), and a member is
matched by its instance id: a lease of an earlier process of a member's instance id is that member's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from agents_stream.kafka import security as kafka_security
from agents_stream.settings import Settings, bootstrap_servers

__all__ = [
    "CLIENT_PREFIX", "client_id", "group_members", "in_group", "instance_of", "members_of", "replaced_by", "worker_id",
]

log = logging.getLogger(__name__)

#: the Kafka client id of a worker is this prefix and its worker id
CLIENT_PREFIX = "agents-stream:"
#: a group between two generations lists members that may not be in the next one
STABLE = "Stable"


def worker_id(instance_id: str = "") -> str:
    """A new process's worker id: ``<host>:<pid>:<random>``, after ``<instance id>@`` under static membership."""
    own = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    return f"{instance_id}@{own}" if instance_id else own


def instance_of(worker: str) -> str | None:
    """The static membership id a worker id starts with, or None (dynamic membership). Host names hold no '@'."""
    instance, at, _ = worker.rpartition("@")
    return instance if at else None


def in_group(worker: str, members: frozenset[str]) -> bool:
    """``worker`` is one of ``members`` (worker ids read from the group): by its instance id under static
    membership (the group describes a restarted member with its first process's client id), else by its id."""
    instance = instance_of(worker)
    if instance is None:
        return worker in members
    return any(instance_of(m) == instance for m in members)


def replaced_by(worker: str, me: str) -> bool:
    """``worker`` is an earlier process of ``me``'s static membership id: the coordinator gave its place in the group
    to ``me`` when ``me`` joined, and at most one process runs per id, so it can no longer act."""
    instance = instance_of(worker)
    return instance is not None and worker != me and instance == instance_of(me)


def client_id(worker_id: str) -> str:
    """The Kafka client id a worker's consumer announces (the group's members are read back from it)."""
    return CLIENT_PREFIX + worker_id


def members_of(description: dict[str, Any]) -> frozenset[str] | None:
    """The worker ids of a described group's members; None unless the group is stable (mid-rebalance, a member
    that is about to be expelled is still listed, and one that is about to join is not)."""
    if description.get("error_code") or description.get("state") != STABLE:
        return None
    ids = (str(m.get("client_id", "")) for m in description.get("members") or ())
    return frozenset(c[len(CLIENT_PREFIX):] for c in ids if c.startswith(CLIENT_PREFIX))


async def group_members(settings: Settings, group: str, timeout_s: float = 5.0) -> tuple[frozenset[str] | None, str]:
    """The worker ids of ``group``'s members now and the group's state, or (None, why) when the coordinator could
    not say within ``timeout_s`` or the group is between generations (then leases are waited out, as without
    this)."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap_servers(settings.broker), **kafka_security.client_kwargs(settings),
    )
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        responses = await asyncio.wait_for(admin.describe_consumer_groups([group]), timeout_s)
        groups = [g for r in responses for g in r.to_object().get("groups", ())]
    except (KafkaError, OSError, asyncio.TimeoutError) as exc:
        return None, f"not described: {exc!r}"
    finally:
        try:
            await asyncio.wait_for(admin.close(), timeout_s)
        except Exception as exc:  # closing is best effort
            log.debug("Closing the admin client failed: %r", exc)
    found = next((g for g in groups if g.get("group") == group), None)
    if found is None:
        return None, "not described: the coordinator does not know it"
    return members_of(found), f"state {found.get('state')!r}, error code {found.get('error_code')}"
