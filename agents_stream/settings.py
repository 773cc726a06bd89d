"""The one typed settings object: every value has an environment name, a default and a doc."""

from __future__ import annotations

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
    max_attempts: int = _setting(
        "AGENTS_STREAM_MAX_ATTEMPTS", 3,
        "Dispatches of one task (lease expiries) before it is dead-lettered with error_layer=recovery.",
    )
    payload_max_bytes: int = _setting(
        "AGENTS_STREAM_PAYLOAD_MAX_BYTES", 262144,
        "Larger task payloads are dead-lettered as payload_too_large.",
    )
    dlq_retention_days: int = _setting("AGENTS_STREAM_DLQ_RETENTION_DAYS", 30, "Retention of the dead-letter topics.")
    shutdown_grace_s: float = _setting(
        "AGENTS_STREAM_SHUTDOWN_GRACE_S", 10.0,
        "On SIGTERM, how long in-flight calls may finish before they are left to lease recovery.",
    )
    session_timeout_s: float = _setting(
        "AGENTS_STREAM_SESSION_TIMEOUT_S", 10.0,
        "Kafka group session timeout: how soon a dead worker's partitions move.",
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
    public_url: str = _setting(
        "AGENTS_STREAM_PUBLIC_URL", "",
        "Base URL approval links point at (a worker or a proxy in front of them); empty: http://WEB_HOST:WEB_PORT.",
    )
    api_token: str = _setting(
        "AGENTS_STREAM_API_TOKEN", "",
        "Bearer token mutating web endpoints require (approve, reject).",
    )
    api_open: bool = _setting(
        "AGENTS_STREAM_API_OPEN", False,
        "Allow mutating web endpoints without a token (logged at start). Only for local demos.",
    )
    log_level: str = _setting("AGENTS_STREAM_LOG_LEVEL", "info", "Worker log level (debug, info, warn, error).")

    #: never printed, logged or sent
    SECRETS = frozenset({"approval_secret", "api_token", "kafka_sasl_password"})

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
