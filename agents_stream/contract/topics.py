"""Topic names of the contract (docs/contract.md, "Topics") and the partitioning they rely on."""

from __future__ import annotations

from aiokafka.partitioner import murmur2

RESULTS = "agent.results"
#: Public: one ConversationReply per run of a conversation (contract/conversation_messages.py), keyed by conversation_id
REPLIES = "agent.replies"
#: Public: a conversation's progress (messages, runs, tool calls, replies) for its event stream, keyed by
#: conversation_id (tables/conversation_events.py)
CONVERSATION_EVENTS = "agent.conversation.events"
CONTROL = "agent.control"
JOBS = "agent.jobs"
#: Public: approval decisions (ApprovalDecision JSON), keyed by task_id
APPROVALS = "agent.approvals"
#: Public: one JobResult per job, keyed by job_id
JOB_RESULTS = "agent.job.results"
#: Internal, shared by every app id: results of a job's tasks and deadline events for the orchestrator, keyed by job_id
JOB_EVENTS = "agent.job.events"
#: Internal, one partition, shared by every app id: breaker, Retry-After and presence events
#: (agents_stream.resilience.circuits)
CIRCUITS = "agent.circuits"
TASK_PREFIX = "agent.tasks."
#: headers of a task requeued from its dead-letter topic (agents_stream.ops.dlq): the requeue's id,
#: and the dead-letter headers of every earlier failure (JSON list, oldest first)
REQUEUE_HEADER = "agents_stream.requeue_id"
HISTORY_HEADER = "agents_stream.history"


def task_topic(agent: str) -> str:
    return f"{TASK_PREFIX}{agent}"


def dlq_topic(agent: str) -> str:
    return f"{TASK_PREFIX}{agent}.dlq"


def outcomes_topic(app_id: str) -> str:
    """Internal: executor → ledger outcome and heartbeat events, keyed by task_id."""
    return f"agent.outcomes.{app_id}"


def answers_topic(app_id: str) -> str:
    """Internal: last-good-answer cache stores and lookups, keyed by the task's fingerprint."""
    return f"agent.answers.{app_id}"


def dlq_of(topic: str) -> str:
    """Dead letters of a public input topic other than a task topic (``agent.approvals``, ``agent.jobs``)."""
    return f"{topic}.dlq"


def agent_of(topic: str) -> str | None:
    """``agent.tasks.analyzer`` → ``analyzer``; None for other topics."""
    if topic.startswith(TASK_PREFIX) and not topic.endswith(".dlq"):
        return topic[len(TASK_PREFIX):]
    return None


def partition_for(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner (murmur2, as the Java client and aiokafka place keys)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
