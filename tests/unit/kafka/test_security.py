"""Broker credentials without a broker: settings → Faust's broker_credentials and aiokafka kwargs,
and the checks at start."""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import subprocess
from pathlib import Path

import faust
import pytest
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from agents_stream.kafka import security as kafka_security
from agents_stream.kafka.security import KafkaSecurityError, broker_credentials, client_kwargs, parse
from agents_stream.settings import Settings

PASSWORD = "s3cr3t-never-shown"


def settings(**env: str) -> Settings:
    return Settings.from_env({f"AGENTS_STREAM_KAFKA_{k.upper()}": v for k, v in env.items()})


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A self-signed certificate (usable as CA file and as client certificate), its key, and both in one file."""
    d = tmp_path_factory.mktemp("pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test",
         "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
        check=True, capture_output=True,
    )
    (d / "both.pem").write_text((d / "key.pem").read_text() + (d / "cert.pem").read_text())
    (d / "garbage.pem").write_text("not a certificate\n")
    return {"cert": d / "cert.pem", "key": d / "key.pem", "both": d / "both.pem", "garbage": d / "garbage.pem"}


def test_default_is_plaintext_without_credentials():
    """No security settings: PLAINTEXT for every client, no Faust credentials (the local broker's 9092 listener)."""
    assert client_kwargs(Settings.from_env({})) == {"security_protocol": "PLAINTEXT"}
    assert broker_credentials(Settings.from_env({})) is None


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_plaintext_gives_the_same_auth_to_faust_and_to_plain_clients(mechanism):
    """SASL_PLAINTEXT with each mechanism: Faust's credentials reach aiokafka exactly as our own clients' kwargs do."""
    s = settings(security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism, sasl_username="agents",
                 sasl_password=PASSWORD)
    kwargs = client_kwargs(s)
    assert kwargs == {
        "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
        "sasl_plain_username": "agents", "sasl_plain_password": PASSWORD,
    }
    creds = broker_credentials(s)
    assert isinstance(creds, faust.SASLCredentials) and creds.mechanism.value == mechanism
    assert credentials_to_aiokafka_auth(creds) == {**kwargs, "ssl_context": None}


def test_sasl_ssl_uses_a_verifying_tls_context_with_the_ca_file(pem):
    """SASL_SSL: the broker's certificate and host name are checked against AGENTS_STREAM_KAFKA_SSL_CAFILE."""
    s = settings(security_protocol="sasl_ssl", sasl_mechanism="plain", sasl_username="key", sasl_password=PASSWORD,
                 ssl_cafile=str(pem["cert"]))
    kwargs = client_kwargs(s)
    context = kwargs.pop("ssl_context")
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "test"),),)]
    assert kwargs == {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_plain_username": "key",
                      "sasl_plain_password": PASSWORD}
    creds = broker_credentials(s)
    assert creds.protocol.value == "SASL_SSL" and creds.ssl_context is not None
    assert credentials_to_aiokafka_auth(creds)["security_protocol"] == "SASL_SSL"


def test_sasl_ssl_without_a_ca_file_trusts_the_system_store():
    """Managed brokers with public certificates need no CA file: the context still verifies."""
    s = settings(security_protocol="SASL_SSL", sasl_username="key", sasl_password=PASSWORD)
    context = client_kwargs(s)["ssl_context"]
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


@pytest.mark.parametrize("files", [("both", None), ("cert", "key")])
def test_ssl_with_a_client_certificate_in_one_or_two_files(pem, files):
    """SSL (mutual TLS): the client certificate loads from one PEM file or from certificate + key files."""
    certfile, keyfile = files
    env = {"security_protocol": "SSL", "ssl_cafile": str(pem["cert"]), "ssl_certfile": str(pem[certfile])}
    if keyfile:
        env["ssl_keyfile"] = str(pem[keyfile])
    s = settings(**env)
    assert set(client_kwargs(s)) == {"security_protocol", "ssl_context"}
    creds = broker_credentials(s)
    assert isinstance(creds, faust.SSLCredentials)
    assert credentials_to_aiokafka_auth(creds)["security_protocol"] == "SSL"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"security_protocol": "SASL"}, "AGENTS_STREAM_KAFKA_SECURITY_PROTOCOL='SASL' is not one of"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI", "sasl_username": "u", "sasl_password": "p"},
         "AGENTS_STREAM_KAFKA_SASL_MECHANISM='GSSAPI' is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
        ({"security_protocol": "SASL_PLAINTEXT"},
         "SASL_PLAINTEXT needs AGENTS_STREAM_KAFKA_SASL_USERNAME and AGENTS_STREAM_KAFKA_SASL_PASSWORD"),
        ({"security_protocol": "SASL_SSL", "sasl_username": "u"}, "SASL_SSL needs AGENTS_STREAM_KAFKA_SASL_PASSWORD"),
        ({"sasl_username": "u", "sasl_password": "p"}, "PLAINTEXT does not use SASL"),
        ({"security_protocol": "SASL_PLAINTEXT", "sasl_username": "u", "sasl_password": "p", "ssl_cafile": "/ca.pem"},
         "AGENTS_STREAM_KAFKA_SSL_CAFILE set but "
         "AGENTS_STREAM_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT does not use TLS"),
        ({"security_protocol": "SSL", "ssl_cafile": "/nonexistent/ca.pem"},
         "AGENTS_STREAM_KAFKA_SSL_CAFILE='/nonexistent/ca.pem': no such file"),
        ({"security_protocol": "SSL", "ssl_keyfile": "/k.pem"},
         "AGENTS_STREAM_KAFKA_SSL_KEYFILE is set without AGENTS_STREAM_KAFKA_SSL_CERTFILE"),
    ],
)
def test_invalid_combinations_fail_naming_the_setting(env, named):
    """A misconfiguration stops the worker or the CLI at start with the setting's name, before any connection."""
    with pytest.raises(KafkaSecurityError, match=re.escape(named)):
        client_kwargs(settings(**env))
    with pytest.raises(KafkaSecurityError):
        broker_credentials(settings(**env))


def test_unreadable_pem_files_fail_naming_the_setting(pem):
    """A CA or client certificate file that is not PEM fails at start, naming its setting."""
    with pytest.raises(KafkaSecurityError, match="AGENTS_STREAM_KAFKA_SSL_CAFILE=.* is not a PEM CA certificate"):
        client_kwargs(settings(security_protocol="SSL", ssl_cafile=str(pem["garbage"])))
    with pytest.raises(KafkaSecurityError, match="AGENTS_STREAM_KAFKA_SSL_CERTFILE=.*not a PEM certificate"):
        client_kwargs(settings(security_protocol="SSL", ssl_certfile=str(pem["cert"])))  # no key anywhere


def test_the_password_is_never_shown(capsys):
    """The SASL password appears in no repr, description or `agents-stream settings` output."""
    from agents_stream.ops.cli import main

    s = settings(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512", sasl_username="agents",
                 sasl_password=PASSWORD)
    shown = [repr(s), str(s), repr(parse(s)), parse(s).describe(), repr(broker_credentials(s))]
    assert all(PASSWORD not in text for text in shown), shown
    assert "SCRAM-SHA-512 as user 'agents'" in parse(s).describe()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGENTS_STREAM_KAFKA_SASL_PASSWORD", PASSWORD)
        assert main(["settings"]) == 0
    out = capsys.readouterr().out
    assert PASSWORD not in out and "AGENTS_STREAM_KAFKA_SASL_PASSWORD=<set, not shown>" in out


def test_cli_refuses_invalid_security_settings_with_exit_2(monkeypatch, capsys):
    """`agents-stream publish` with a SASL protocol but no user exits 2, naming the missing setting."""
    from agents_stream.ops.cli import main

    monkeypatch.setenv("AGENTS_STREAM_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    assert main(["publish", "--agent", "analyzer", "-q"]) == 2
    assert "AGENTS_STREAM_KAFKA_SASL_USERNAME" in capsys.readouterr().err


def test_diagnose_names_the_refusal_and_the_settings_but_not_the_password():
    """When bootstrap fails, the one-line reason says what was tried (protocol, mechanism, user), never the password."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    st = settings(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256", sasl_username="agents",
                  sasl_password=PASSWORD)
    reason = asyncio.run(kafka_security.diagnose(st, f"127.0.0.1:{port}", timeout=5))
    assert f"127.0.0.1:{port}:" in reason and "SASL SCRAM-SHA-256 as user 'agents'" in reason
    assert PASSWORD not in reason
