"""Broker credentials end to end: a worker and the CLI on the local broker's SASL_PLAINTEXT and SASL_SSL listeners.

scripts/broker.sh gives the local broker these listeners besides PLAINTEXT, with
local-only test credentials; the ports and the data dir (where the CA file is)
come from the same environment variables as there, with the same defaults.
Results are read back on the PLAINTEXT listener, as in every other test.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .harness import ROOT, Worker, results_for, task, unique

SASL_PORT = int(os.environ.get("KAFKA_SASL_PORT", "9094"))
SASL_SSL_PORT = int(os.environ.get("KAFKA_SASL_SSL_PORT", "9095"))
CA_FILE = Path(os.environ.get("KAFKA_DATA_DIR", ROOT / ".data" / "kafka")) / "tls" / "ca.pem"
USER, PASSWORD = "agents", "agents-local-secret"  # scripts/broker.sh's local-only test user
WRONG_PASSWORD = "not-the-password-4711"


@pytest.fixture(scope="module", autouse=True)
def sasl_listeners() -> None:
    """Fail loudly (never skip) when the broker runs without the SASL listeners, e.g. started by an older broker.sh."""
    for port in (SASL_PORT, SASL_SSL_PORT):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        except OSError as exc:
            pytest.fail(
                f"No SASL listener on 127.0.0.1:{port} ({exc}); restart the local broker so it has them: "
                "scripts/broker.sh stop && scripts/broker.sh start", pytrace=False,
            )
    if not CA_FILE.is_file():
        pytest.fail(f"No CA file at {CA_FILE}: set KAFKA_DATA_DIR to the broker's data dir", pytrace=False)


def credentials(port: int, mechanism: str, *, tls: bool, password: str = PASSWORD) -> dict[str, str]:
    env = {
        "KAFKA_BROKER": f"kafka://127.0.0.1:{port}",
        "AGENTS_STREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL" if tls else "SASL_PLAINTEXT",
        "AGENTS_STREAM_KAFKA_SASL_MECHANISM": mechanism,
        "AGENTS_STREAM_KAFKA_SASL_USERNAME": USER,
        "AGENTS_STREAM_KAFKA_SASL_PASSWORD": password,
    }
    if tls:
        env["AGENTS_STREAM_KAFKA_SSL_CAFILE"] = str(CA_FILE)
    return env


async def publish(agent: str, tasks: list[dict], env: dict[str, str]) -> subprocess.CompletedProcess:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "agents_stream.ops.cli", "publish", "--agent", agent],
        input="".join(json.dumps(t) + "\n" for t in tasks),
        env={**os.environ, **env}, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )


def assert_no_password(*outputs: str) -> None:
    for text in outputs:
        assert PASSWORD not in text and WRONG_PASSWORD not in text, "a SASL password reached a log or the terminal"


@pytest.mark.parametrize(
    ("port", "mechanism", "tls"),
    [(SASL_PORT, "SCRAM-SHA-512", False), (SASL_SSL_PORT, "PLAIN", True)],
    ids=["sasl_plaintext-scram-sha-512", "sasl_ssl-plain"],
)
async def test_worker_and_cli_over_sasl_process_a_task_end_to_end(cluster_factory, port, mechanism, tls):
    """A worker and `agents-stream publish` with the same credentials: the task's result arrives;
    no password is logged."""
    agent = unique("secure")
    c = cluster_factory([agent], None)
    env = credentials(port, mechanism, tls=tls)
    w = await c.started(**env)
    t = task(agent)
    proc = await publish(agent, [t], env)
    assert proc.returncode == 0, proc.stderr
    results = await results_for({t["task_id"]}, timeout=60)
    assert json.loads(results[t["task_id"]][0].value)["status"] == "succeeded"
    log = w.log_path.read_text(errors="replace")
    assert f"Authenticated as {USER} via {mechanism}" in log, "the worker's clients logged in over SASL"
    assert_no_password(log, proc.stdout, proc.stderr)


async def test_wrong_password_stops_the_cli_and_the_worker_with_the_reason(cluster_factory):
    """A refused login: the CLI exits 1 and the worker exits (not hangs),
    both saying the broker refused the credentials."""
    agent = unique("secure")
    env = credentials(SASL_PORT, "SCRAM-SHA-256", tls=False, password=WRONG_PASSWORD)
    proc = await publish(agent, [task(agent)], env)
    assert proc.returncode == 1, proc.stderr
    assert "SaslAuthenticationFailed" in proc.stderr and "as user 'agents'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr

    c = cluster_factory([agent], None)
    w: Worker = c.worker(**env).start()
    code = await asyncio.to_thread(w.proc.wait, 60)
    log = w.log_path.read_text(errors="replace")
    assert code != 0, log
    assert "Cannot connect to the Kafka broker" in log and "SaslAuthenticationFailed" in log, w.tail()
    assert_no_password(log, proc.stdout, proc.stderr)
