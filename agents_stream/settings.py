"""The one typed settings object: every value has an environment name, a default and a doc."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

#: where a worker keeps its tables when neither ``faust --datadir`` nor AGENTS_STREAM_DATA_DIR says: one
#: directory per app id, so workers of two app ids on one host never open each other's RocksDB stores
DEFAULT_DATA_ROOT = ".data/worker"


def bootstrap_servers(broker_url: str) -> str:
    """``kafka://a:9092,kafka://b:9092`` (Faust's form, KAFKA_BROKER) → ``a:9092,b:9092`` (aiokafka's)."""
    return ",".join(part.strip().split("://", 1)[-1] for part in broker_url.split(",") if part.strip())


#: the shortest approval secret a worker or the CLI accepts: it signs links and decisions (HMAC-SHA256)
APPROVAL_SECRET_MIN_CHARS = 32


def _parse_bool(env: str, raw: str) -> bool:
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{env}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def _setting(env: str, default: Any, doc: str) -> Any:
    return field(default=default, metadata={"env": env, "doc": doc})


@dataclass(frozen=True)
class Settings:
    """Read with ``Settings.from_env()``; ``agents-stream settings`` prints them all."""

    broker: str = _setting("KAFKA_BROKER", "kafka://localhost:9092", "Kafka bootstrap URL(s), comma-separated.")
    # Broker credentials, used by every Kafka client (agents_stream.kafka.security checks them at start).
    kafka_security_protocol: str = _setting(
        "AGENTS_STREAM_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT",
        "Kafka security protocol: PLAINTEXT, SASL_PLAINTEXT, SSL or SASL_SSL.",
    )
    kafka_sasl_mechanism: str = _setting(
        "AGENTS_STREAM_KAFKA_SASL_MECHANISM", "PLAIN",
        "SASL mechanism (SASL_* protocols): PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.",
    )
    kafka_sasl_username: str = _setting(
        "AGENTS_STREAM_KAFKA_SASL_USERNAME", "",
        "SASL user name (an API key on managed Kafka); needed by SASL_*.",
    )
    kafka_sasl_password: str = _setting(
        "AGENTS_STREAM_KAFKA_SASL_PASSWORD", "",
        "SASL password (an API secret); needed by SASL_*. Never printed or logged.",
    )
    kafka_ssl_cafile: str = _setting(
        "AGENTS_STREAM_KAFKA_SSL_CAFILE", "",
        "PEM CA certificate(s) that signed the broker's certificate (SSL, SASL_SSL); empty: the system trust store.",
    )
    kafka_ssl_certfile: str = _setting(
        "AGENTS_STREAM_KAFKA_SSL_CERTFILE", "",
        "PEM client certificate, if the broker asks for one (SSL, SASL_SSL); may hold the key too.",
    )
    kafka_ssl_keyfile: str = _setting(
        "AGENTS_STREAM_KAFKA_SSL_KEYFILE", "",
        "PEM unencrypted private key of the client certificate, if not in the certificate file.",
    )
    app_id: str = _setting(
        "AGENTS_STREAM_APP_ID", "agents-stream",
        "App id = consumer group id and table/changelog prefix.",
    )
    start_from: str = _setting(
        "AGENTS_STREAM_START_FROM", "",
        "Where this app id starts a task topic it has never read but another app id has: earliest (every "
        "task still in the topic, again), latest (only tasks published from now on) or group:<app id> (where "
        "that app id has got to). Empty: the worker refuses to start and says so. Asked once per topic: the "
        "choice is committed. A topic no app id has read is read from the start.",
    )
    config_path: str = _setting(
        "AGENTS_STREAM_CONFIG", "",
        "TOML file of providers and agents; empty = the packaged default.",
    )
    agents: str = _setting(
        "AGENTS_STREAM_AGENTS", "",
        "Comma-separated subset of the configured agents this worker runs; empty = all.",
    )
    web_port: int = _setting("WEB_PORT", 6066, "Port of the worker's web views.")
    web_host: str = _setting(
        "WEB_HOST", "127.0.0.1",
        "Address other workers reach this worker's web views at (table reads are forwarded to the key's owner there); "
        "also the one they listen on unless WEB_BIND is set.",
    )
    web_bind: str = _setting(
        "WEB_BIND", "",
        "Address the web views listen on, when not WEB_HOST (0.0.0.0 in a container: WEB_HOST is then its own IP).",
    )
    data_dir: str = _setting(
        "AGENTS_STREAM_DATA_DIR", "",
        "Where this worker keeps its RocksDB tables (one per worker on a host); Faust's --datadir wins over it. "
        "Empty: .data/worker/<app id>.",
    )
    partitions: int = _setting(
        "AGENTS_STREAM_PARTITIONS", 8,
        "Partitions of every topic the app creates: the ceiling of scale-out.",
    )
    replication_factor: int = _setting(
        "AGENTS_STREAM_REPLICATION_FACTOR", 0,
        "Replicas of every topic the app creates; 0: min(3, brokers in the cluster at start) (docs/cluster.md).",
    )
    min_insync_replicas: int = _setting(
        "AGENTS_STREAM_MIN_INSYNC_REPLICAS", 0,
        "min.insync.replicas of every topic the app creates (acks=all writes need that many replicas); "
        "0: 2 with three or more replicas, else 1.",
    )
    max_in_flight: int = _setting("AGENTS_STREAM_MAX_IN_FLIGHT", 64, "Provider calls one worker runs at once.")
    max_queued: int = _setting(
        "AGENTS_STREAM_MAX_QUEUED", 256,
        "Dispatched tasks waiting for a call slot before intake pauses.",
    )
    max_retries: int = _setting(
        "AGENTS_STREAM_MAX_RETRIES", 4,
        "Retries of a transient provider error before the task is held.",
    )
    backoff_base_s: float = _setting("AGENTS_STREAM_BACKOFF_BASE_S", 0.5, "First retry delay; doubles each retry.")
    backoff_cap_s: float = _setting(
        "AGENTS_STREAM_BACKOFF_CAP_S", 30.0,
        "Largest retry delay (Retry-After may ask for more).",
    )
    probe_interval_s: float = _setting(
        "AGENTS_STREAM_PROBE_INTERVAL_S", 5.0,
        "How often a held provider is probed with a real call.",
    )
    lease_ttl_s: float = _setting(
        "AGENTS_STREAM_LEASE_TTL_S", 30.0,
        "A dispatched task's lease; a worker that stops renewing it loses the task.",
    )
    record_ttl_s: float = _setting(
        "AGENTS_STREAM_RECORD_TTL_S", 0.0,
        "How long a finished task's record is kept (0: the task topics' retention; never less than it; < 0: forever).",
    )
    standby_replicas: int = _setting(
        "AGENTS_STREAM_STANDBY_REPLICAS", 1,
        "Standby copies of each table partition kept by other workers, so a failover starts warm (0: none).",
    )
    expiry_batch: int = _setting(
        "AGENTS_STREAM_EXPIRY_BATCH", 500,
        "Task-table entries the expiry sweep looks at per partition each AGENTS_STREAM_EXPIRY_INTERVAL_S.",
    )
    expiry_interval_s: float = _setting(
        "AGENTS_STREAM_EXPIRY_INTERVAL_S", 5.0,
        "How often the expiry sweep looks for finished records past their time to live.",
    )
    conversation_idle_s: float = _setting(
        "AGENTS_STREAM_CONVERSATION_IDLE_S", 30 * 24 * 3600.0,
        "A conversation with no message or reply for this long, and no round answering, is deleted (every record "
        "of it, as agents-stream conversations delete does); 0: kept until deleted.",
    )
    max_attempts: int = _setting(
        "AGENTS_STREAM_MAX_ATTEMPTS", 3,
        "Dispatches of one task (lease expiries) before it is dead-lettered with error_layer=recovery.",
    )
    payload_max_bytes: int = _setting(
        "AGENTS_STREAM_PAYLOAD_MAX_BYTES", 262144,
        "Larger task payloads are dead-lettered as payload_too_large.",
    )
    record_max_bytes: int = _setting(
        "AGENTS_STREAM_RECORD_MAX_BYTES", 1_000_000,
        "Largest record the worker sends (a task's table record, an outcome, a result): also the producer's "
        "max_request_size; every topic's max.message.bytes must be at least this (checked at start). A task whose "
        "record would pass it ends failed with result_too_large.",
    )
    stream_text: bool = _setting(
        "AGENTS_STREAM_STREAM_TEXT", True,
        "Stream the model's text of conversation rounds to agent.conversation.events as chunk events while the "
        "provider writes it (its streaming API); off: the text arrives with the turn and the reply only.",
    )
    answer_max_bytes: int = _setting(
        "AGENTS_STREAM_ANSWER_MAX_BYTES", 262144,
        "Largest answer (UTF-8 bytes) one provider call may give; a larger one fails the task with result_too_large.",
    )
    max_steps: int = _setting(
        "AGENTS_STREAM_MAX_STEPS", 32,
        "Most steps a multi-step task may have; a task with more is dead-lettered as too_many_steps.",
    )
    output_check_budget_s: float = _setting(
        "AGENTS_STREAM_OUTPUT_CHECK_BUDGET_S", 1.0,
        "CPU seconds one check of an answer against its output schema may use (off the event loop); past them the "
        "task fails as output_check_aborted (a pattern that backtracks without end).",
    )
    dlq_retention_days: int = _setting("AGENTS_STREAM_DLQ_RETENTION_DAYS", 30, "Retention of the dead-letter topics.")
    shutdown_grace_s: float = _setting(
        "AGENTS_STREAM_SHUTDOWN_GRACE_S", 10.0,
        "On SIGTERM, how long in-flight calls may finish before they are left to lease recovery.",
    )
    session_timeout_s: float = _setting(
        "AGENTS_STREAM_SESSION_TIMEOUT_S", 6.0,
        "Kafka group session timeout: how soon a dead or cut-off worker's partitions move, and its tasks are taken "
        "over (6 s is the broker's default minimum, group.min.session.timeout.ms).",
    )
    instance_id: str = _setting(
        "AGENTS_STREAM_INSTANCE_ID", "",
        "Static group membership (Kafka's group.instance.id): a worker restarted with the same id takes its "
        "predecessor's place in the group at once (its tasks are taken over without waiting for the session to "
        "expire), and one back within the session timeout gets its partitions without a rebalance. At most one "
        "running process per id (a StatefulSet's pod name); empty: dynamic membership.",
    )
    heartbeat_interval_s: float = _setting("AGENTS_STREAM_HEARTBEAT_INTERVAL_S", 1.0, "Kafka group heartbeat interval.")
    stall_after_s: float = _setting(
        "AGENTS_STREAM_STALL_AFTER_S", 15.0,
        "An assigned partition with unread records whose read position has not moved for this long is read again from "
        "there, and so is a table recovery's changelog partition (0: never).",
    )
    commit_interval_s: float = _setting(
        "AGENTS_STREAM_COMMIT_INTERVAL_S", 1.0,
        "How often the commit watermark is committed.",
    )
    rocksdb_cache_mb: int = _setting(
        "AGENTS_STREAM_ROCKSDB_CACHE_MB", 8,
        "Block cache per RocksDB store (one per table partition).",
    )
    circuits_history_s: float = _setting(
        "AGENTS_STREAM_CIRCUITS_HISTORY_S", 600.0,
        "How far back a starting worker reads the shared circuits log (breakers, Retry-After, presence).",
    )
    circuits_report_s: float = _setting(
        "AGENTS_STREAM_CIRCUITS_REPORT_S", 1.0,
        "How often a worker puts the count of its successful provider calls on the circuits log (the breakers' "
        "failure rate; a failure carries the count at once). One record per endpoint per interval, only with "
        "traffic.",
    )
    presence_interval_s: float = _setting(
        "AGENTS_STREAM_PRESENCE_INTERVAL_S", 5.0,
        "How often a worker announces itself on the circuits log (shared limits are split among live workers).",
    )
    jobs: str = _setting(
        "AGENTS_STREAM_JOBS", "auto",
        "Run the job orchestrator (agent.jobs) in this app: 1, 0, or auto (on when the worker runs every configured "
        "agent). Exactly one app id may run it.",
    )
    approval_secret: str = _setting(
        "AGENTS_STREAM_APPROVAL_SECRET", "",
        "HMAC key of approve/reject links (the same on every worker); empty: notifications carry no links.",
    )
    conversation_secret: str = _setting(
        "AGENTS_STREAM_CONVERSATION_SECRET", "",
        "HMAC key of per-conversation tokens (POST /conversations/<id>/token), the same on every worker, at least 32 "
        "characters; empty: no such tokens (only the operator tokens open the conversation API).",
    )
    approval_require_signed: bool = _setting(
        "AGENTS_STREAM_APPROVAL_REQUIRE_SIGNED", False,
        "Refuse decisions on agent.approvals that carry no valid signature (an operator's CLI then needs the secret); "
        "off: they are applied and recorded as signed: false.",
    )
    approval_max_awaiting: int = _setting(
        "AGENTS_STREAM_APPROVAL_MAX_AWAITING", 1000,
        "Tasks of one agent that may await approval at once, split evenly over the partitions (each holds at most "
        "ceil(N / partitions)); a task over it is dead-lettered (approval_backlog_full). 0: no cap.",
    )
    webhook_rate_per_s: float = _setting(
        "AGENTS_STREAM_WEBHOOK_RATE_PER_S", 5.0,
        "Approval webhook posts one worker starts per second (retries included).",
    )
    webhook_queue_max: int = _setting(
        "AGENTS_STREAM_WEBHOOK_QUEUE_MAX", 1000,
        "Approval notifications waiting to be posted; one more is dropped with a warning (the approval still waits, "
        "escalates and is listed).",
    )
    public_url: str = _setting(
        "AGENTS_STREAM_PUBLIC_URL", "",
        "Base URL approval links point at (a worker or a proxy in front of them); empty: http://WEB_HOST:WEB_PORT.",
    )
    api_token: str = _setting(
        "AGENTS_STREAM_API_TOKEN", "",
        "Bearer token mutating web endpoints require (approve, reject, requeue, cancel); it grants reads too.",
    )
    read_token: str = _setting(
        "AGENTS_STREAM_READ_TOKEN", "",
        "Bearer token that grants reads of task data (/tasks, /jobs, /approvals, /dlq, /circuits) but no mutation; "
        "empty: only AGENTS_STREAM_API_TOKEN reads.",
    )
    api_open: bool = _setting(
        "AGENTS_STREAM_API_OPEN", False,
        "Allow every web endpoint without a token (logged at start). Only for local demos: refused at start unless "
        "the web views listen on a loopback address.",
    )
    web_allowed_hosts: str = _setting(
        "AGENTS_STREAM_WEB_ALLOWED_HOSTS", "",
        "Comma-separated extra Host header values the web views answer (name or name:port; a name alone: any port; "
        "* turns the check off), besides WEB_HOST:WEB_PORT, the public URL's host and, on loopback, localhost.",
    )
    web_dlq_reads: int = _setting(
        "AGENTS_STREAM_WEB_DLQ_READS", 2,
        "Dead-letter reads (GET /dlq, GET /dlq/<ref>, requeue look-ups) one worker runs at once; more answer 503 "
        "with Retry-After.",
    )
    console_sample_s: float = _setting(
        "AGENTS_STREAM_CONSOLE_SAMPLE_S", 2.0,
        "How often a worker samples its throughput, consumer lag, calls in flight, held tasks and breakers for the "
        "console's charts (GET /samples), in memory.",
    )
    console_history_s: float = _setting(
        "AGENTS_STREAM_CONSOLE_HISTORY_S", 600.0,
        "How far back the console's charts reach: the samples each worker keeps in memory (a few hundred bytes each).",
    )
    console_recent: int = _setting(
        "AGENTS_STREAM_CONSOLE_RECENT", 200,
        "Tasks, and jobs, each worker keeps in memory for the console's recent list (GET /recent): the last ones "
        "its ledger changed.",
    )
    log_level: str = _setting("AGENTS_STREAM_LOG_LEVEL", "info", "Worker log level (debug, info, warn, error).")

    #: never printed, logged or sent
    SECRETS = frozenset({"approval_secret", "conversation_secret", "api_token", "read_token", "kafka_sasl_password"})

    def __repr__(self) -> str:
        # A logged or printed Settings must not carry a secret.
        def shown(name: str) -> str:
            return "<set, not shown>" if name in self.SECRETS and getattr(self, name) else repr(getattr(self, name))

        return f"Settings({', '.join(f'{f.name}={shown(f.name)}' for f in fields(self))})"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then the environment, then explicit overrides."""
        source: Mapping[str, str] = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = source.get(f.metadata["env"])
            if raw is not None and raw != "":
                kind: Any = type(f.default)  # every field has a default of its type
                values[f.name] = _parse_bool(f.metadata["env"], raw) if isinstance(f.default, bool) else kind(raw)
        values.update(overrides)
        return cls(**values)

    def __post_init__(self) -> None:
        # float("inf") and float("nan") parse; a lease, a backoff or a grace of either disables what it bounds
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(f.default, float) and isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.metadata['env']}={value!r} is not a finite number")
        if not 0 < self.console_sample_s <= self.console_history_s:
            raise ValueError(
                f"AGENTS_STREAM_CONSOLE_SAMPLE_S={self.console_sample_s!r} must be above 0 and at most "
                f"AGENTS_STREAM_CONSOLE_HISTORY_S={self.console_history_s!r}"
            )

    def jobs_enabled(self) -> bool:
        if self.jobs == "auto":
            return not self.agent_filter()
        return _parse_bool("AGENTS_STREAM_JOBS", self.jobs)

    def worker_data_dir(self, cli_datadir: str | None = None) -> str:
        """The data directory: Faust's ``--datadir`` when given, else AGENTS_STREAM_DATA_DIR, else
        ``.data/worker/<app id>`` (namespaced: another app id on the host has its own)."""
        if cli_datadir:
            return cli_datadir
        return self.data_dir or str(Path(DEFAULT_DATA_ROOT) / self.app_id)

    def approval_secret_problem(self) -> str | None:
        """Why the approval or conversation secret cannot be used (too short to resist guessing), or None when
        unset or good."""
        for env, value, unset in (
            ("AGENTS_STREAM_APPROVAL_SECRET", self.approval_secret, "to send notifications without links"),
            ("AGENTS_STREAM_CONVERSATION_SECRET", self.conversation_secret, "to issue no conversation tokens"),
        ):
            if value and len(value) < APPROVAL_SECRET_MIN_CHARS:
                return (
                    f"{env} has {len(value)} characters; it needs at least {APPROVAL_SECRET_MIN_CHARS} (e.g. python3 "
                    f"-c 'import secrets; print(secrets.token_urlsafe(32))'), or leave it unset {unset}"
                )
        return None

    def approval_share(self) -> int:
        """How many tasks of one agent may await approval on one partition (0: no cap)."""
        if self.approval_max_awaiting <= 0:
            return 0
        return -(-self.approval_max_awaiting // max(1, self.partitions))

    def link_base(self) -> str:
        return self.public_url or f"http://{self.web_host}:{self.web_port}"

    def agent_filter(self) -> set[str]:
        return {a.strip() for a in self.agents.split(",") if a.strip()}

    @classmethod
    def describe(cls) -> list[tuple[str, str, Any, str]]:
        """(field, env name, default, doc) for every setting."""
        return [(f.name, f.metadata["env"], f.default, f.metadata["doc"]) for f in fields(cls)]


def datadir_option(argv: Sequence[str]) -> str | None:
    """The value of Faust's own ``--datadir``/``-D`` option when ``argv`` is Faust's command line
    (``faust -A agents_stream.app --datadir X worker``), else None.

    Faust imports the app module before it applies that option (it reads ``-A`` and ``-W`` from argv the same
    way, first), and this app's tables are defined at import: so the app reads the option here.
    """
    if not argv or not (Path(argv[0]).name == "faust" or Path(argv[0]).parent.name == "faust"):
        return None
    for i, arg in enumerate(argv[1:], 1):
        if arg in ("-D", "--datadir"):
            return argv[i + 1] if i + 1 < len(argv) else None
        if arg.startswith("--datadir="):
            return arg.partition("=")[2] or None
    return None
