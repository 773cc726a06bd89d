"""Faust's partition assignor, for a worker that took an earlier process's place under static membership.

A static member that comes back within its session gets the assignment the group's leader computed for its
predecessor (no rebalance: that is the point of static membership). Faust's assignor asserts that the web URL in
that assignment is this process's own; after a restart on a new address or port the assertion fails inside the
Kafka client's group coordination, which then stops for good: the worker never reads a record again. Here the
assignment is taken as it is and the worker asks for a new generation at once, in which the leader records its
current URL (the web views route requests for a partition to its owner's URL).
"""

from __future__ import annotations

import logging
from typing import Any, cast

from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from faust.assignor import PartitionAssignor
from faust.assignor.client_assignment import ClientMetadata

__all__ = ["Assignor"]

log = logging.getLogger(__name__)


class Assignor(PartitionAssignor):
    """``PartitionAssignor`` that survives an assignment made for this static member's predecessor."""

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        metadata = cast(ClientMetadata, ClientMetadata.loads(self._decompress(assignment.user_data)))
        here = str(self._url)
        if metadata.url == here:
            super().on_assignment(assignment)
            return
        # Faust's on_assignment without its URL assertion (faust/assignor/partition_assignor.py).
        self._assignment = metadata.assignment
        self._topic_groups = dict(metadata.topic_groups)
        self._active_tps = self._assignment.active_tps
        self._standby_tps = self._assignment.standby_tps
        self.changelog_distribution = metadata.changelog_distribution
        self.external_topic_distribution = metadata.external_topic_distribution
        log.warning(
            "This worker got the assignment made for an earlier process of its static membership id, at %s (this "
            "one is at %s): it keeps it and asks the group for a new generation so the others learn its address",
            metadata.url, here,
        )
        request_rejoin(self.app)


def request_rejoin(app: Any) -> None:
    """Ask the group for a new generation (``WatermarkConsumer.request_rejoin``), never raising: this runs inside the
    Kafka client's group coordination, which an exception stops for good."""
    try:
        app.consumer.request_rejoin()
    except Exception as exc:  # the assignment stands; only the web views' routing to this worker is stale
        log.warning("Asking the group for a new generation failed (%r): requests for this worker's partitions are "
                    "routed to its old address until the next rebalance", exc)
