"""The `agents-stream` command line: the fake LLM server starts with its own options."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request


def test_fake_llm_command_serves_on_the_given_port():
    """`agents-stream fake-llm --port N` answers the probe endpoint on port N."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "agents_stream.ops.cli", "fake-llm", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                    assert json.loads(r.read()) == {"fake": True}
                    break
            except OSError:
                assert proc.poll() is None, "fake-llm exited"
                assert time.monotonic() < deadline, "fake-llm did not answer in 20s"
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_settings_command_lists_every_environment_name(capsys):
    """`agents-stream settings` prints each setting's environment name."""
    from agents_stream.ops.cli import main
    from agents_stream.settings import Settings

    assert main(["settings"]) == 0
    out = capsys.readouterr().out
    assert all(env in out for _, env, _, _ in Settings.describe())
