"""deploy/prometheus's alert and recording rules: valid for Prometheus, every alert tested by promtool, and only on
metrics the workers export.

promtool comes from Debian's prometheus package, which `make test` installs (scripts/prometheus.sh) before it runs
tests/unit. The tests that run it are marked ``promtool`` (the fixture and the skip: tests/unit/conftest.py):
without promtool they are skipped with the reason, unless CI is set; then they fail and say how to get it.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.repo.test_deploy import exported_names

ROOT = Path(__file__).resolve().parents[3]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS_DIR / "rules" / "agents-stream.yml"
RULES_TEST = ROOT / "tests" / "prometheus" / "agents-stream.test.yml"
#: a metric name in an expression, not part of a recording rule's level:metric:operations name
METRIC = re.compile(r"(?<![\w:])agents_stream_[a-z0-9_]+(?![\w:])")
RECORDED = re.compile(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b")
Promtool = Callable[..., subprocess.CompletedProcess[str]]


def rules() -> list[dict[str, Any]]:
    return [r for group in yaml.safe_load(RULES.read_text())["groups"] for r in group["rules"]]


@pytest.mark.promtool
def test_rules_and_the_config_that_loads_them_pass_promtool_check(promtool: Promtool) -> None:
    """`promtool check config` loads prometheus.yml and, through its rule_files, the rules: both parse and every
    expression is valid PromQL."""
    done = promtool("check", "config", str(PROMETHEUS_DIR / "prometheus.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout, f"prometheus.yml does not load {RULES}:\n{done}"
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.promtool
def test_every_alert_fires_in_promtools_rule_tests(promtool: Promtool) -> None:
    """`promtool test rules` passes, and it makes every alert of the rules file fire at least once (with its
    labels and rendered annotations)."""
    done = promtool("test", "rules", str(RULES_TEST))
    assert done.returncode == 0, done.stdout + done.stderr
    cases = [case for test in yaml.safe_load(RULES_TEST.read_text())["tests"] for case in test["alert_rule_test"]]
    fired = {case["alertname"] for case in cases if case["exp_alerts"]}
    alerts = {r["alert"] for r in rules() if "alert" in r}
    assert alerts == fired, f"alerts no promtool test makes fire: {sorted(alerts - fired)}"


def test_rules_read_only_metrics_the_workers_export_and_rules_they_record() -> None:
    """Every agents_stream_* name in a rule is in agents_stream.ops.metrics, and every level:metric:operations
    name one reads is recorded above it; each alert has a severity and says what happened and what to do."""
    exported, recorded = exported_names(), set()
    for rule in rules():
        used = set(METRIC.findall(rule["expr"]))
        assert used <= exported, f"{rule.get('alert') or rule['record']} reads {sorted(used - exported)}"
        assert set(RECORDED.findall(rule["expr"])) <= recorded, f"{rule} reads a recording not defined before it"
        if "record" in rule:
            assert RECORDED.fullmatch(rule["record"]), rule["record"]
            recorded.add(rule["record"])
            continue
        assert rule["alert"].startswith("AgentsStream") and rule["labels"]["severity"] in ("page", "ticket")
        notes = rule["annotations"]
        assert notes["summary"].strip() and len(notes["description"]) > 200, rule["alert"]
    assert {"agents_stream_tasks_held", "agents_stream_breaker_state", "agents_stream_dead_letters_total",
            "agents_stream_consumer_lag_messages"} <= {m for r in rules() for m in METRIC.findall(r["expr"])}
