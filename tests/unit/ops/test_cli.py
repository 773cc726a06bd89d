"""The `agents-stream` command line: the fake LLM server starts with its own options."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest


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


def test_tasks_show_prints_a_newline_as_an_indented_line_and_still_escapes_other_controls() -> None:
    """A result's text with newlines reads as lines (not ``\\x0a``); an escape sequence stays escaped, and no value
    can start a line of its own (issue 29 item 4)."""
    from agents_stream.ops.cli_common import printable_tree
    from agents_stream.ops.cli_views import _render_task

    body = {"task_id": "t-1", "agent": "analyzer", "state": "done", "dispatch": 1,
            "result": {"status": "succeeded", "confidence": "high", "source": "local",
                       "output": "Q3 revenue:\n1200\x1b[2J", "error": None}}
    shown = _render_task(printable_tree(body, newlines=True))
    assert "output: Q3 revenue:\n    1200\\x1b[2J" in shown
    assert "\\x0a" not in shown


def test_fausts_benign_rebalance_warnings_are_debug_lines_and_others_stay_warnings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every worker start logged Faust's "Missing sensor state for rebalance #1" as a WARNING (issue 29 item 4)."""
    import logging

    from agents_stream.faust_app import AgentsStreamApp, BenignFaustWarnings, quiet_benign_faust_warnings

    logger = logging.getLogger("tests.benign-faust-warnings")
    quiet_benign_faust_warnings(logger)
    quiet_benign_faust_warnings(logger)
    assert sum(isinstance(f, BenignFaustWarnings) for f in logger.filters) == 1
    with caplog.at_level(logging.INFO):
        logger.warning("[^-AgentsStreamApp]: Missing sensor state for rebalance #%s", 1)
        logger.warning("[^-AgentsStreamApp]: Missing sensor state for rebalance end #%s", 1)
        logger.warning("something else")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("WARNING", "something else")]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        logger.warning("Missing sensor state for rebalance #%s", 2)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("DEBUG", "Missing sensor state for rebalance #2")]
    assert AgentsStreamApp.logger.name == "agents_stream.faust_app"  # where mode sends the App's own lines


def test_the_chat_shows_a_handoff_the_wait_a_persons_reply_and_the_hand_back() -> None:
    from agents_stream.client import Event
    from agents_stream.ops.cli_chat import _render

    def shown(kind: str, **data: Any) -> str | None:
        return _render(Event(offset=0, kind=kind, data={"kind": kind, "data": data}))

    assert shown("handed_over", by=None, reason="no model provider could answer", source="outage") == (
        "  ⇢ handed to a person (outage: no model provider could answer)")
    assert shown("handoff_escalated", to=1, level_name="desk-lead") == (
        "  ⇢ still waiting for a person: level 2 (desk-lead) asked")
    assert "every level's time ran out" in (shown("handoff_escalated", to=None) or "")
    assert shown("taken", by="ana") == "  ⇢ ana took it"
    assert shown("reply", status="succeeded", text="Ana here.\x1b[2J", human=True, operator="ana") == (
        "ana (a person)> Ana here.\\x1b[2J")
    assert shown("handed_back", by="ana", note="refunded") == "  ⇠ handed back to the agent by ana"
