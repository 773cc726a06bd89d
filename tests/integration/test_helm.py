"""The Helm chart (deploy/helm/agents-stream, docs/guide/kubernetes.md): it renders with every value set below,
`helm lint --strict` passes on each, every object it renders validates against the Kubernetes schemas of two
Kubernetes versions, values that contradict each other are refused, and what it promises a worker holds on a real
one: started from the rendered container (its command, environment, secrets and config) against the broker, it
serves the rendered probe and scrape paths on the rendered port and joins the consumer group KEDA watches, as the
member its pod name says.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiokafka.admin import AIOKafkaAdminClient

from agents_stream.config import load_config
from agents_stream.kafka.members import CLIENT_PREFIX
from agents_stream.settings import bootstrap_servers

from .harness import BOOTSTRAP, PARTITIONS, ROOT, eventually, free_port, unique
from .helm_chart import (
    CHART,
    KAFKA_SCALER_METADATA,
    NAMESPACE,
    RELEASE,
    RULES,
    helm,
    one,
    plain_env,
    render,
    render_error,
    validate,
    values_file,
    worker_container,
)

FULLNAME = f"{RELEASE}-agents-stream"
DEFAULT_CONFIG = ROOT / "agents_stream" / "default_config.toml"
KEYS = {"GEMINI_API_KEY": "gm-key-never-in-plain-sight", "AGENTS_STREAM_API_TOKEN": "api-token-never-in-plain-sight"}

#: the value sets every test renders: the defaults, and each part of the chart switched on, off or given its own
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "keda": {
        "kafka": {"broker": "kafka://k1.kafka:9092, kafka://k2.kafka:9092", "partitions": 12},
        "keda": {"enabled": True, "minReplicaCount": 2, "maxReplicaCount": 12, "topic": "agent.tasks.analyzer",
                 "authenticationRef": "kafka-sasl"},
    },
    "monitoring": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
                   "prometheusRule": {"enabled": True, "labels": {"release": "kps"}}},
    "no-persistence": {"persistence": {"enabled": False}, "podDisruptionBudget": {"enabled": False},
                       "staticMembership": False, "replicaCount": 1},
    "custom-storage": {"persistence": {"storageClassName": "fast-ssd", "size": "20Gi"},
                       "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}}},
    "existing-secret": {"secrets": {"existingSecret": "agents-keys"}, "config": {"existingConfigMap": "my-agents"},
                        "imagePullSecrets": [{"name": "registry"}]},
    "keys-and-config": {
        "secrets": {"env": KEYS},
        "config": {"toml": '[providers.local]\nkind = "local"\n\n[agents.helper]\nproviders = ["local"]\n'},
        "env": {"AGENTS_STREAM_SESSION_TIMEOUT_S": 20, "AGENTS_STREAM_JOBS": "0"},
        "web": {"publicUrl": "https://agents.example.com", "allowedHosts": ["agents.example.com"]},
        "shutdownGraceSeconds": 30, "terminationGracePeriodSeconds": 60,
    },
}

#: the kinds each value set must render (a template that silently rendered nothing would pass validation)
EXPECTED_KINDS = {
    "defaults": {"StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget"},
    "keda": {"StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget", "ScaledObject"},
    "monitoring": {"StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget", "ServiceMonitor", "PrometheusRule"},
    "no-persistence": {"StatefulSet", "Service", "ConfigMap"},
    "custom-storage": {"StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget"},
    "existing-secret": {"StatefulSet", "Service", "PodDisruptionBudget"},
    "keys-and-config": {"StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget", "Secret"},
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("helm")
    return {name: render(tmp, name, values) for name, values in VALUE_SETS.items()}


def test_every_value_set_renders_lints_and_validates(rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    checked = 0
    for name, objects in rendered.items():
        assert {o["kind"] for o in objects} == EXPECTED_KINDS[name], name
        problems = [p for obj in objects for p in validate(obj)]
        assert not problems, f"value set {name!r}:\n" + "\n".join(problems)
        checked += len(objects)
        lint = helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE,
                    "-f", str(values_file(tmp_path, name, VALUE_SETS[name])))
        assert lint.returncode == 0, f"helm lint --strict with value set {name!r}:\n{lint.stdout}{lint.stderr}"
    print(f"{len(rendered)} value sets, {checked} objects rendered, linted and validated")


def test_a_broken_object_fails_validation(rendered: dict[str, list[dict[str, Any]]]) -> None:
    # the validation the test above relies on does refuse: a misspelt field, in a built-in kind and in a custom one
    statefulset = one(rendered["defaults"], "StatefulSet")
    broken = {**statefulset, "spec": {**statefulset["spec"], "terminationGracePeriod": 45}}
    assert any("terminationGracePeriod" in p for p in validate(broken))
    scaled = one(rendered["keda"], "ScaledObject")
    assert any("maxReplicas" in p for p in validate({**scaled, "spec": {**scaled["spec"], "maxReplicas": 3}}))


@pytest.mark.parametrize(("values", "says"), [
    ({"replicaCount": PARTITIONS + 1}, f"replicaCount ({PARTITIONS + 1}) is more than kafka.partitions ({PARTITIONS})"),
    ({"kafka": {"partitions": 4}, "replicaCount": 5}, "replicaCount (5) is more than kafka.partitions (4)"),
    ({"keda": {"enabled": True, "maxReplicaCount": PARTITIONS + 1}},
     f"keda.maxReplicaCount ({PARTITIONS + 1}) is more than kafka.partitions ({PARTITIONS})"),
    ({"keda": {"enabled": True, "minReplicaCount": 3, "maxReplicaCount": 2}},
     "keda.minReplicaCount (3) is more than keda.maxReplicaCount (2)"),
    ({"terminationGracePeriodSeconds": 24},
     "terminationGracePeriodSeconds (24) is shorter than shutdownGraceSeconds (10) + 15"),
    ({"shutdownGraceSeconds": 40}, "terminationGracePeriodSeconds (45) is shorter than shutdownGraceSeconds (40) + 15"),
    ({"env": {"AGENTS_STREAM_PARTITIONS": "64"}},
     "env.AGENTS_STREAM_PARTITIONS is set by the chart (kafka.partitions)"),
    ({"kafka": {"partitions": 0}}, "partitions"),  # values.schema.json
    ({"keda": {"enabled": True, "maxReplicas": 4}}, "maxReplicas"),  # a misspelt value, refused by the schema
], ids=["replicas", "replicas-few-partitions", "keda-max", "keda-min-max", "grace", "shutdown-grace", "own-env",
        "no-partitions", "unknown-value"])
def test_rendering_refuses_contradicting_values(tmp_path: Path, values: dict[str, Any], says: str) -> None:
    assert says in render_error(tmp_path, "bad", values)


def test_the_bounds_are_inclusive(tmp_path: Path) -> None:
    # as many workers as partitions, and a termination grace of exactly the shutdown's, render
    objects = render(tmp_path, "edge", {"replicaCount": PARTITIONS, "terminationGracePeriodSeconds": 25,
                                        "keda": {"enabled": True, "maxReplicaCount": PARTITIONS}})
    assert one(objects, "ScaledObject")["spec"]["maxReplicaCount"] == PARTITIONS


def test_grace_and_replicas_hold_in_every_value_set(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for name, objects in rendered.items():
        statefulset = one(objects, "StatefulSet")
        env = plain_env(worker_container(objects))
        pod = statefulset["spec"]["template"]["spec"]
        # the drain, then up to 5 s for results to be confirmed and 10 s for the final commit (app.py, on_stop)
        assert pod["terminationGracePeriodSeconds"] >= float(env["AGENTS_STREAM_SHUTDOWN_GRACE_S"]) + 15, name
        partitions = int(env["AGENTS_STREAM_PARTITIONS"])
        scaled = [o for o in objects if o["kind"] == "ScaledObject"]
        if scaled:
            assert "replicas" not in statefulset["spec"], f"{name}: KEDA owns the replicas; helm must not set them"
            assert scaled[0]["spec"]["minReplicaCount"] <= scaled[0]["spec"]["maxReplicaCount"] <= partitions, name
        else:
            assert 1 <= statefulset["spec"]["replicas"] <= partitions, name


def test_keda_watches_the_workers_group(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["keda"]
    env = plain_env(worker_container(objects))
    spec = one(objects, "ScaledObject")["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": FULLNAME}
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "kafka" and trigger["authenticationRef"] == {"name": "kafka-sasl"}
    metadata = trigger["metadata"]
    assert set(metadata) <= KAFKA_SCALER_METADATA, set(metadata) - KAFKA_SCALER_METADATA
    # the group the workers join is their app id; the servers are the workers' own, in aiokafka's form
    assert metadata["consumerGroup"] == env["AGENTS_STREAM_APP_ID"]
    assert metadata["bootstrapServers"] == bootstrap_servers(env["KAFKA_BROKER"]) == "k1.kafka:9092,k2.kafka:9092"
    assert metadata["topic"] == "agent.tasks.analyzer"
    # KEDA's own bound counts every topic's partitions: only the chart's keeps workers within one topic's
    assert metadata["allowIdleConsumers"] == "false"


def test_alert_rules_are_the_repositorys_and_scraped_as_their_job(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["monitoring"]
    rules = yaml.safe_load(RULES.read_text())
    assert one(objects, "PrometheusRule")["spec"] == rules
    monitor = one(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    (endpoint,) = monitor["spec"]["endpoints"]
    # AgentsStreamWorkerDown looks for up{job="..."}: the scrape's job must be that one
    (job,) = set(re.findall(r'up\{job="([^"]+)"\}', RULES.read_text()))
    assert {"action": "replace", "targetLabel": "job", "replacement": job} in endpoint["relabelings"]
    # the endpoint is the worker's port, on a Service that selects the pods whether ready or not
    container = worker_container(objects)
    assert endpoint["port"] in {p["name"] for p in container["ports"]} and endpoint["path"] == "/metrics"
    (headless,) = [s for s in objects if s["kind"] == "Service" and s["metadata"]["labels"].items()
                   >= monitor["spec"]["selector"]["matchLabels"].items()]
    assert headless["spec"]["publishNotReadyAddresses"] is True
    pod_labels = one(objects, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert headless["spec"]["selector"].items() <= pod_labels.items()


def test_the_packaged_chart_carries_the_linked_rules_and_config(tmp_path: Path) -> None:
    # files/ links to the repository's rules and default config: `helm package` must store their content
    done = helm("package", str(CHART), "--destination", str(tmp_path))
    assert done.returncode == 0, done.stderr
    (archive,) = tmp_path.glob("agents-stream-*.tgz")
    rendered = helm("template", RELEASE, str(archive), "--namespace", NAMESPACE, "--set", "prometheusRule.enabled=true")
    assert rendered.returncode == 0, rendered.stderr
    objects = [o for o in yaml.safe_load_all(rendered.stdout) if o]
    assert one(objects, "PrometheusRule")["spec"] == yaml.safe_load(RULES.read_text())
    assert one(objects, "ConfigMap")["data"]["config.toml"] == DEFAULT_CONFIG.read_text()


def test_keys_reach_the_workers_only_through_secrets(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["keys-and-config"]
    secret = one(objects, "Secret")
    assert {k: base64.b64decode(v).decode() for k, v in secret["data"].items()} == KEYS
    envfrom = worker_container(objects)["envFrom"]
    assert {"secretRef": {"name": secret["metadata"]["name"]}} in envfrom
    for obj in objects:
        if obj["kind"] != "Secret":
            text = yaml.safe_dump(obj)
            assert not any(value in text for value in KEYS.values()), f"a key in plain sight in {obj['kind']}"
    # a Secret made outside the chart: referenced, none made, the config from its own ConfigMap
    objects = rendered["existing-secret"]
    assert worker_container(objects)["envFrom"] == [{"secretRef": {"name": "agents-keys"}}]
    volumes = one(objects, "StatefulSet")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "my-agents", "items": [{"key": "config.toml", "path": "config.toml"}]} in [
        v.get("configMap") for v in volumes]


def test_every_rendered_config_is_one_the_worker_loads(rendered: dict[str, list[dict[str, Any]]],
                                                       tmp_path: Path) -> None:
    for name, objects in rendered.items():
        for configmap in (o for o in objects if o["kind"] == "ConfigMap"):
            path = tmp_path / f"{name}.toml"
            path.write_text(configmap["data"]["config.toml"])
            assert load_config(str(path)).agents, name
    assert one(rendered["defaults"], "ConfigMap")["data"]["config.toml"] == DEFAULT_CONFIG.read_text()


def test_storage_follows_persistence(rendered: dict[str, list[dict[str, Any]]]) -> None:
    claim = one(rendered["custom-storage"], "StatefulSet")["spec"]["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    statefulset = one(rendered["no-persistence"], "StatefulSet")
    assert "volumeClaimTemplates" not in statefulset["spec"]
    assert {"name": "data", "emptyDir": {}} in statefulset["spec"]["template"]["spec"]["volumes"]
    for objects in rendered.values():
        mounts = {m["mountPath"]: m["name"] for m in worker_container(objects)["volumeMounts"]}
        assert mounts["/data"] == "data" and plain_env(worker_container(objects))["AGENTS_STREAM_DATA_DIR"] == "/data"


def kubelet_env(objects: list[dict[str, Any]], fields: dict[str, str], mounts: dict[str, Path]) -> dict[str, str]:
    """The worker container's environment as the kubelet makes it: envFrom's Secrets first, env over them, the
    downward API's ``fields``; and a path under a volume's mount point at the local directory standing in for it."""
    container = worker_container(objects)
    env: dict[str, str] = {}
    for ref in container.get("envFrom", []):
        secret = one(objects, "Secret", ref["secretRef"]["name"])
        env.update({k: base64.b64decode(v).decode() for k, v in secret["data"].items()})
    for entry in container["env"]:
        env[entry["name"]] = entry["value"] if "value" in entry else fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    for mount_path, local in mounts.items():
        env = {k: f"{local}{v[len(mount_path):]}" if v == mount_path or v.startswith(mount_path + "/") else v
               for k, v in env.items()}
    return env


async def http_get(port: int, path: str, host: str, token: str = "") -> tuple[int, str]:
    headers = {"Host": host, **({"Authorization": f"Bearer {token}"} if token else {})}
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}{path}", headers=headers,
                               timeout=aiohttp.ClientTimeout(total=5)) as r:
            return r.status, await r.text()


async def test_a_worker_started_as_rendered_serves_its_probes_and_joins_as_its_pod(
    tmp_path: Path, workers_data: Path,
) -> None:
    app_id, agent, port, token = unique("helm"), unique("helm_agent"), free_port(), "helm-read-token"
    objects = render(tmp_path, "live", {
        "kafka": {"broker": f"kafka://{BOOTSTRAP}", "appId": app_id, "partitions": PARTITIONS},
        "web": {"port": port},
        "config": {"toml": f'[providers.local]\nkind = "local"\n\n[agents.{agent}]\nproviders = ["local"]\n'},
        "secrets": {"env": {"AGENTS_STREAM_READ_TOKEN": token}},
        # one app id per test on a shared broker: only the job tests run the orchestrator (harness.py)
        "env": {"AGENTS_STREAM_JOBS": "0"},
        "shutdownGraceSeconds": 5, "terminationGracePeriodSeconds": 20,
        "serviceMonitor": {"enabled": True},
    })
    container, statefulset = worker_container(objects), one(objects, "StatefulSet")
    pod = f"{statefulset['metadata']['name']}-0"
    mounts = {m["mountPath"]: workers_data / f"volume-{m['name']}" for m in container["volumeMounts"]}
    for local in mounts.values():
        local.mkdir()
    (mounts["/etc/agents-stream"] / "config.toml").write_text(one(objects, "ConfigMap")["data"]["config.toml"])
    env = kubelet_env(objects, {"metadata.name": pod, "status.podIP": "127.0.0.1"}, mounts)
    (container_port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "http"]
    assert container_port == port
    # the image's command (Dockerfile CMD, the chart's args) from this venv; its working directory is /data
    command = [str(Path(sys.executable).with_name(container["args"][0])), *container["args"][1:]]
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, env={**env, "PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1"},
                                cwd=mounts["/data"], stdout=out, stderr=subprocess.STDOUT)
    kubelet_host = f"10.42.0.7:{port}"  # the kubelet probes the pod's IP: the probes answer whatever the Host
    try:
        async def probe(kind: str) -> tuple[int, str]:
            if proc.poll() is not None:
                raise AssertionError(f"the worker exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            path = container[f"{kind}Probe"]["httpGet"]["path"]
            assert container[f"{kind}Probe"]["httpGet"]["port"] == "http"
            try:
                return await http_get(port, path, kubelet_host)
            except (aiohttp.ClientError, asyncio.TimeoutError):
                return 0, "refused"  # the port opens after table recovery: what the startup probe allows for

        await eventually(lambda: _ok(probe("startup")), timeout=90, what="the startup probe's 200")
        await eventually(lambda: _ok(probe("readiness")), timeout=60, what="the readiness probe's 200")
        status, body = await probe("liveness")
        assert status == 200 and yaml.safe_load(body)["worker"].startswith(f"{pod}@"), body
        (endpoint,) = one(objects, "ServiceMonitor")["spec"]["endpoints"]
        status, body = await http_get(port, endpoint["path"], kubelet_host)
        assert status == 200 and "agents_stream_" in body
        # the API answers by the Service's names, with the Secret's token; not by another site's name
        service = f"{FULLNAME}.{NAMESPACE}.svc.cluster.local:{port}"
        assert (await http_get(port, "/circuits", service, token))[0] == 200
        assert (await http_get(port, "/circuits", f"elsewhere.example:{port}", token))[0] == 421
        # the group KEDA watches is the one the worker joined, as the static member its pod name makes it
        group = one(render(tmp_path, "live-keda", {"kafka": {"appId": app_id}, "keda": {"enabled": True}}),
                    "ScaledObject")["spec"]["triggers"][0]["metadata"]["consumerGroup"]
        admin = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP)
        await asyncio.wait_for(admin.start(), 20)
        try:
            clients = await eventually(lambda: _members(admin, group), timeout=30, what=f"group {group}'s members")
        finally:
            await admin.close()
        assert any(c.startswith(f"{CLIENT_PREFIX}{pod}@") for c in clients), clients
        # SIGTERM: not ready at once, out within the pod's termination grace (the kubelet's SIGKILL after it)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        await eventually(lambda: _status(probe("readiness"), {503, 0}), timeout=10, what="readiness to fail")
        grace = statefulset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert await asyncio.to_thread(proc.wait, grace) == 0
        print(f"stopped {time.monotonic() - started:.1f} s after SIGTERM (termination grace {grace} s)")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(mounts["/data"], ignore_errors=True)


async def _ok(response: Any) -> bool:
    return (await response)[0] == 200


async def _status(response: Any, statuses: set[int]) -> bool:
    return (await response)[0] in statuses


async def _members(admin: AIOKafkaAdminClient, group: str) -> list[str]:
    responses = await asyncio.wait_for(admin.describe_consumer_groups([group]), 10)
    groups = [g for r in responses for g in r.to_object().get("groups", ()) if g.get("group") == group]
    return [str(m.get("client_id", "")) for g in groups for m in g.get("members") or ()]
