"""Broker credentials: the AGENTS_STREAM_KAFKA_* settings as Faust's ``broker_credentials`` and aiokafka client kwargs.

Every Kafka client the project makes (the Faust app, the admin client that
creates topics, the circuits consumer, the CLI and the dead-letter tools)
takes its security from here, so one set of settings reaches all of them.

Faust hands ``broker_credentials`` to aiokafka unchanged
(``faust.transport.drivers.aiokafka.credentials_to_aiokafka_auth``): a
``SASLCredentials`` becomes ``security_protocol``, ``sasl_mechanism`` (SCRAM
included, passed through by name), ``sasl_plain_username``/``password`` and
``ssl_context``; its protocol is SASL_SSL exactly when it has an SSL context.
The password never appears in a ``repr`` made here.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agents_stream.settings import Settings

__all__ = [
    "MECHANISMS", "PROTOCOLS", "KafkaSecurity", "KafkaSecurityError", "broker_credentials", "client_kwargs", "diagnose",
    "parse",
]

PROTOCOLS = ("PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

_PROTOCOL = "AGENTS_STREAM_KAFKA_SECURITY_PROTOCOL"
_MECHANISM = "AGENTS_STREAM_KAFKA_SASL_MECHANISM"
_USERNAME = "AGENTS_STREAM_KAFKA_SASL_USERNAME"
_PASSWORD = "AGENTS_STREAM_KAFKA_SASL_PASSWORD"  # noqa: S105 (a setting's name)
_CAFILE = "AGENTS_STREAM_KAFKA_SSL_CAFILE"
_CERTFILE = "AGENTS_STREAM_KAFKA_SSL_CERTFILE"
_KEYFILE = "AGENTS_STREAM_KAFKA_SSL_KEYFILE"


class KafkaSecurityError(ValueError):
    """The Kafka security settings are invalid or do not fit together; the message names the setting."""


@dataclass(frozen=True)
class KafkaSecurity:
    """Validated security settings. ``sasl`` and ``tls`` say which halves of the protocol are on."""

    protocol: str = "PLAINTEXT"
    mechanism: str = "PLAIN"
    username: str = ""
    password: str = field(default="", repr=False)
    cafile: str = ""
    certfile: str = ""
    keyfile: str = ""

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")

    def describe(self) -> str:
        """One line for logs and error messages: protocol, mechanism and user, never the password."""
        parts = [f"security protocol {self.protocol}"]
        if self.sasl:
            parts.append(f"SASL {self.mechanism} as user {self.username!r}")
        if self.tls:
            parts.append(f"CA {self.cafile or 'the system trust store'}")
        return ", ".join(parts)


def parse(settings: Settings) -> KafkaSecurity:
    """Validate the settings; raises KafkaSecurityError naming the setting at fault."""
    protocol = settings.kafka_security_protocol.strip().upper()
    mechanism = settings.kafka_sasl_mechanism.strip().upper()
    sec = KafkaSecurity(
        protocol, mechanism, settings.kafka_sasl_username, settings.kafka_sasl_password,
        settings.kafka_ssl_cafile, settings.kafka_ssl_certfile, settings.kafka_ssl_keyfile,
    )
    if protocol not in PROTOCOLS:
        raise KafkaSecurityError(
            f"{_PROTOCOL}={settings.kafka_security_protocol!r} is not one of {', '.join(PROTOCOLS)}"
        )
    if mechanism not in MECHANISMS:
        raise KafkaSecurityError(
            f"{_MECHANISM}={settings.kafka_sasl_mechanism!r} is not one of {', '.join(MECHANISMS)}"
        )
    if sec.sasl:
        missing = [name for name, value in ((_USERNAME, sec.username), (_PASSWORD, sec.password)) if not value]
        if missing:
            raise KafkaSecurityError(f"{_PROTOCOL}={protocol} needs {' and '.join(missing)}")
    elif sec.username or sec.password:
        # Credentials that would be ignored are a configuration mistake, not a default to fall back on.
        raise KafkaSecurityError(
            f"{_USERNAME}/{_PASSWORD} are set but {_PROTOCOL}={protocol} does not use SASL; "
            "set it to SASL_SSL or SASL_PLAINTEXT"
        )
    files = ((_CAFILE, sec.cafile), (_CERTFILE, sec.certfile), (_KEYFILE, sec.keyfile))
    if not sec.tls:
        named = [name for name, value in files if value]
        if named:
            raise KafkaSecurityError(
                f"{', '.join(named)} set but {_PROTOCOL}={protocol} does not use TLS; set it to SSL or SASL_SSL"
            )
        return sec
    if sec.keyfile and not sec.certfile:
        raise KafkaSecurityError(f"{_KEYFILE} is set without {_CERTFILE} (the client certificate it belongs to)")
    for name, path in files:
        if path and not os.path.isfile(path):
            raise KafkaSecurityError(f"{name}={path!r}: no such file")
    return sec


def ssl_context(sec: KafkaSecurity) -> ssl.SSLContext | None:
    """The TLS context for SSL and SASL_SSL (server certificate and host name verified), else None."""
    if not sec.tls:
        return None
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=sec.cafile or None)
    except (ssl.SSLError, OSError) as exc:
        raise KafkaSecurityError(f"{_CAFILE}={sec.cafile!r} is not a PEM CA certificate ({exc})") from None
    if sec.certfile:
        try:
            # password="": an encrypted key fails here instead of prompting on the terminal.
            context.load_cert_chain(sec.certfile, sec.keyfile or None, password="")
        except (ssl.SSLError, OSError) as exc:
            raise KafkaSecurityError(
                f"{_CERTFILE}={sec.certfile!r} / {_KEYFILE}={sec.keyfile!r}: not a PEM certificate "
                f"with its unencrypted key ({exc})"
            ) from None
    return context


def client_kwargs(settings: Settings) -> dict[str, Any]:
    """Security kwargs for AIOKafkaProducer, AIOKafkaConsumer and AIOKafkaAdminClient."""
    sec = parse(settings)
    kwargs: dict[str, Any] = {"security_protocol": sec.protocol}
    if sec.tls:
        kwargs["ssl_context"] = ssl_context(sec)
    if sec.sasl:
        kwargs.update(sasl_mechanism=sec.mechanism, sasl_plain_username=sec.username, sasl_plain_password=sec.password)
    return kwargs


def broker_credentials(settings: Settings) -> Any:
    """Faust's ``broker_credentials``: None (PLAINTEXT), SSLCredentials or SASLCredentials."""
    import faust

    sec = parse(settings)
    if sec.sasl:
        return faust.SASLCredentials(
            username=sec.username, password=sec.password, mechanism=sec.mechanism, ssl_context=ssl_context(sec),
        )
    if sec.tls:
        return faust.SSLCredentials(ssl_context(sec))
    return None


async def diagnose(settings: Settings, bootstrap: str, timeout: float = 10.0) -> str:
    """Why a client could not bootstrap, in one line.

    aiokafka logs each broker's error and then raises a bare "Unable to
    bootstrap"; this connects once more, to each bootstrap address, and
    returns the first refusal (bad credentials, unknown mechanism, TLS
    verification) or connection error, with the settings in use.
    """
    from aiokafka.conn import create_conn
    from aiokafka.errors import KafkaError

    sec = parse(settings)
    kwargs = client_kwargs(settings)
    reasons = []
    for address in bootstrap.split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            conn = await asyncio.wait_for(create_conn(host, int(port), **kwargs), timeout)
        except asyncio.TimeoutError:
            reasons.append(f"{address}: no answer within {timeout:.0f}s")
        except Exception as exc:  # any refusal is the answer we came for
            # Kafka's errors name themselves ("[Error 58] SaslAuthenticationFailed: ..."); others do not.
            named_error = exc if isinstance(exc, KafkaError) else f"{type(exc).__name__}: {exc}"
            reasons.append(f"{address}: {named_error}")
        else:
            conn.close()
            reasons.append(f"{address}: connects now")
    return f"{'; '.join(reasons)} ({sec.describe()})"
