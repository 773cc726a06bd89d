"""A real Prometheus (Debian's package) on deploy/prometheus's config and rules, scraping two real workers: every
PromQL expression of the shipped Grafana dashboard and every recording rule returns series.

Prometheus gets its own data dir under the test's tmp dir, a free port and a 1 s scrape and evaluation interval;
it is stopped by PID at the end. `make test` installs it (scripts/prometheus.sh); without it the test fails.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from agents_stream.contract import topics
from agents_stream.testing.fakellm import ok, status

from .harness import ROOT, encode, eventually, free_port, produce, read_topic, results_for, task, unique

PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS_DIR / "rules" / "agents-stream.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "agents-stream.json"
DATASOURCES = ROOT / "deploy" / "grafana" / "provisioning" / "datasources"
N_TASKS = 8


@dataclass
class Prometheus:
    proc: subprocess.Popen
    url: str
    log_path: Path

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    async def api(self, path: str, **params: str) -> Any:
        """The ``data`` of a successful answer of Prometheus's HTTP API."""
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{self.url}/api/v1/{path}", params=params,
                                   timeout=aiohttp.ClientTimeout(total=10)) as r:
                body = await r.json()
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    async def ready(self, timeout: float = 20.0) -> None:
        """Prometheus answers /-/ready (its storage opened, its config and rules loaded)."""

        async def answers() -> bool:
            assert self.proc.poll() is None, f"Prometheus exited with {self.proc.returncode}:\n{self.tail()}"
            try:
                async with aiohttp.ClientSession() as session:
                    async with session.get(f"{self.url}/-/ready", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        return r.status == 200
            except (aiohttp.ClientError, TimeoutError):
                return False

        try:
            await eventually(answers, timeout=timeout, interval=0.2, what="Prometheus ready")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.tail()}") from None

    async def query(self, promql: str) -> list[dict[str, Any]]:
        return (await self.api("query", query=promql))["result"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def prometheus_config(tmp: Path, targets: list[str]) -> Path:
    """deploy/prometheus/prometheus.yml with the workers as static targets instead of Docker's DNS, 1 s intervals,
    and its rule files by absolute path (the same files, found where the config says)."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    (job,) = config["scrape_configs"]
    del job["dns_sd_configs"]
    job["static_configs"] = [{"targets": targets}]
    config["rule_files"] = [str(PROMETHEUS_DIR / pattern) for pattern in config["rule_files"]]
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def start_prometheus(tmp_path: Path) -> Iterator[Any]:
    started: list[Prometheus] = []

    def start(targets: list[str]) -> Prometheus:
        binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        if not Path(binary).is_file():
            pytest.fail("prometheus not found: run `bash scripts/prometheus.sh` (make test runs it).", pytrace=False)
        port, log_path = free_port(), tmp_path / "prometheus.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [binary, f"--config.file={prometheus_config(tmp_path, targets)}",
                 f"--storage.tsdb.path={tmp_path / 'prometheus-data'}", f"--web.listen-address=127.0.0.1:{port}",
                 "--storage.tsdb.retention.time=1h"],
                stdout=log, stderr=subprocess.STDOUT,
            )
        started.append(Prometheus(proc, f"http://127.0.0.1:{port}", log_path))
        return started[-1]

    yield start
    for prom in started:
        prom.stop()


def dashboard_expressions() -> tuple[list[tuple[str, str]], dict[str, str]]:
    """Every panel target's PromQL and legend, and each template variable's query (Grafana's
    ``label_values(metric, label)``)."""
    board = json.loads(DASHBOARD.read_text())
    exprs = [(t["expr"], t.get("legendFormat", "")) for p in board["panels"] for t in p.get("targets", [])]
    variables = {}
    for var in board["templating"]["list"]:
        variables[var["name"]] = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
    return exprs, variables


def rate_interval() -> str:
    """What Grafana puts for $__rate_interval with the provisioned datasource: 4 x its scrape interval
    (timeInterval), unless the panel's step is longer."""
    (source,) = yaml.safe_load((DATASOURCES / "prometheus.yml").read_text())["datasources"]
    seconds = int(source["jsonData"]["timeInterval"].rstrip("s"))
    return f"{4 * seconds}s"


async def test_every_dashboard_query_and_recording_rule_returns_series(cluster_factory, fake_llm, start_prometheus):
    """After a little work through two workers (a retry, a format retry, a dead letter, priced calls), every
    expression of the Grafana dashboard, with its variables set from their own queries, returns series from a real
    Prometheus; so does every recording rule, and every rule evaluates without error."""
    agent = unique("prom")
    toml = (
        f'[providers.fake]\nkind = "openai"\nbase_url = "{fake_llm.url}/v1"\nmodel = "fake-model"\ntimeout_s = 10\n\n'
        '[prices]\n"fake-model" = { input_per_mtok = 1.0, output_per_mtok = 2.0 }\n\n'
        f'[agents.{agent}]\nproviders = ["fake"]\n'
    )
    c = cluster_factory([agent], None, toml=toml)
    workers = [c.worker().start(), c.worker().start()]
    prom = start_prometheus([f"127.0.0.1:{w.web_port}" for w in workers])
    for w in workers:
        await w.wait_ready()
    await prom.ready()

    # A 503 (a retry), an answer that misses the task's schema (a format retry), then one that fits.
    fake_llm.enqueue(status(503), ok("not JSON"), ok('{"answer": "42"}'))
    schema = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "string"}}}
    first = task(agent, output_schema=schema)
    await produce(topics.task_topic(agent), [encode(first)])
    await results_for({first["task_id"]}, timeout=30)
    # Tasks over both workers' partitions, and a record that is no task (a schema dead letter).
    plain = [task(agent, n=i) for i in range(N_TASKS)]
    await produce(topics.task_topic(agent), [encode(t) for t in plain] + [(b"poison", b"{not json")])
    await results_for({t["task_id"] for t in plain}, timeout=30)
    await read_topic(topics.dlq_topic(agent), until=lambda seen: len(seen) >= 1, timeout=30)

    async def scalar(promql: str) -> str | None:
        found = await prom.query(promql)
        return found[0]["value"][1] if found else None

    seen: dict[str, str | None] = {}

    async def scraped_after_the_work() -> bool:
        # The dead letter is the last counter to appear: increase() over it has a series only once two scrapes
        # saw it (the first sample of a series has nothing before it to increase from).
        seen.update(succeeded=await scalar(f'sum(agents_stream_tasks_total{{agent="{agent}", outcome="succeeded"}})'),
                    dead_letters=await scalar(f'sum(agents_stream_dead_letters_total{{agent="{agent}"}})'),
                    dead_letter_scrapes=await scalar(
                        f'min(count_over_time(agents_stream_dead_letters_total{{agent="{agent}"}}[60s])) >= 2'),
                    workers_up=await scalar('count(up{job="agents-stream"} == 1)'))
        return (seen["succeeded"], seen["dead_letters"], seen["workers_up"]) == (str(N_TASKS + 1), "1", "2") \
            and seen["dead_letter_scrapes"] is not None

    try:
        await eventually(scraped_after_the_work, timeout=20, interval=0.5,
                         what="Prometheus to scrape both workers after the work")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {seen}\nPrometheus log:\n{prom.tail()}") from None

    # The variables: Grafana's label_values(metric, label) is the label's values on the metric's series.
    exprs, variables = dashboard_expressions()
    values = {}
    for name, query in variables.items():
        metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query).groups()  # type: ignore[union-attr]
        values[name] = await prom.api(f"label/{label}/values", **{"match[]": metric})
    assert values == {"agent": [agent], "provider": ["fake"]}, values

    def substituted(expr: str) -> str:
        # A multi-value variable becomes a regex alternation, as Grafana formats it for Prometheus.
        for name, found in values.items():
            expr = expr.replace(f"${name}", "(" + "|".join(re.escape(v) for v in found) + ")")
        expr = expr.replace("$__rate_interval", rate_interval())
        assert "$" not in expr, f"a variable the test does not know: {expr}"
        return expr

    # Rules evaluate every second; the dead-letter ratio needs two scrapes of the dead letter.
    shipped = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    records = [r["record"] for r in shipped if "record" in r]

    async def every_record_has_series() -> list[str] | None:
        missing = [r for r in records if not await prom.query(r)]
        return None if missing else records

    try:
        await eventually(every_record_has_series, timeout=15, interval=0.5, what="series of every recording rule")
    except AssertionError:
        missing = [r for r in records if not await prom.query(r)]
        raise AssertionError(f"recording rules without series: {missing}\nPrometheus log:\n{prom.tail()}") from None

    # Each expression returns series, and they carry every label its legend shows ({{outcome}}, {{instance}}...).
    empty, unlabelled = [], []
    for expr, legend in exprs:
        series = await prom.query(substituted(expr))
        if not series:
            empty.append(substituted(expr))
        shown = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
        unlabelled += [f"{expr} has no {sorted(shown - s['metric'].keys())}: {s['metric']}"
                       for s in series if not shown <= s["metric"].keys()]
    assert not empty, "dashboard expressions that return no series:\n" + "\n".join(empty)
    assert not unlabelled, "series without the labels their legend shows:\n" + "\n".join(unlabelled)

    # Every shipped rule is loaded and evaluates without error, and nothing alerts on this healthy run: the
    # workers' start (up 0 until their port opens) is behind us. Other tests' malformed records on the shared
    # topics (agent.approvals) are dead letters of agent "none" here.
    rules = [r for g in (await prom.api("rules"))["groups"] for r in g["rules"]]
    assert sorted(r["name"] for r in rules) == sorted(r.get("record") or r["alert"] for r in shipped)
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]

    async def alerts_of_ours() -> list[dict[str, str]]:
        rules = [r for g in (await prom.api("rules"))["groups"] for r in g["rules"]]
        return [a["labels"] for r in rules for a in r.get("alerts", []) if a["labels"].get("agent", agent) == agent]

    async def quiet() -> bool:
        return not await alerts_of_ours()

    try:
        await eventually(quiet, timeout=10, interval=0.5, what="no alert pending or firing")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {await alerts_of_ours()}") from None
    print(f"\nprometheus: {len(exprs)} dashboard expressions and {len(records)} recording rules return series; "
          f"{len(rules)} rules healthy, no alert of ours pending")
    prom.stop()
    assert prom.proc.returncode == 0, f"Prometheus exited with {prom.proc.returncode}:\n{prom.tail()}"
