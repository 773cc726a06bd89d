"""The Helm chart under test (deploy/helm/agents-stream): rendered and linted by the real helm, its objects checked
against the Kubernetes schemas (kubernetes-validate) and, for the three custom resources those do not carry, against
the schemas below.

helm is built by ``scripts/helm.sh`` (``make test`` runs it while tests/unit runs) and linked at ``.data/helm``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from .harness import ROOT

HELM = ROOT / ".data" / "helm"
CHART = ROOT / "deploy" / "helm" / "agents-stream"
RULES = ROOT / "deploy" / "prometheus" / "rules" / "agents-stream.yml"
#: the oldest Kubernetes the chart claims (Chart.yaml kubeVersion) and the newest kubernetes-validate carries
KUBERNETES_VERSIONS = ("1.30", "1.37")
RELEASE, NAMESPACE = "demo", "agents"


def helm(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    if not HELM.exists():
        raise AssertionError(f"{HELM} is missing: run `bash scripts/helm.sh` (make test runs it)")
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=timeout)


def values_file(tmp: Path, name: str, values: dict[str, Any]) -> Path:
    path = tmp / f"values-{name}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def render(tmp: Path, name: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    """`helm template` of the chart with ``values``: every object it renders."""
    done = helm(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", f"{KUBERNETES_VERSIONS[-1]}.0",
        "-f", str(values_file(tmp, name, values)),
    )
    if done.returncode != 0:
        raise AssertionError(f"helm template with value set {name!r} failed:\n{done.stderr}")
    return [obj for obj in yaml.safe_load_all(done.stdout) if obj]


def render_error(tmp: Path, name: str, values: dict[str, Any]) -> str:
    """What `helm template` says when it refuses ``values`` (an AssertionError when it renders them)."""
    done = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(values_file(tmp, name, values)))
    if done.returncode == 0:
        raise AssertionError(f"helm template rendered value set {name!r}, which it should refuse")
    return done.stderr


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(found) == 1, f"expected one {kind} {name or ''}, rendered: {names}"
    return found[0]


def worker_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "worker"]
    return container


def plain_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's env entries that carry a value (not the downward API's)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


# -- the custom resources ------------------------------------------------------------------------------------------
# kubernetes-validate carries the schemas of Kubernetes' own kinds only. The three below are held to the fields the
# chart uses of them, as the CRDs of Prometheus Operator v0.93.0 (monitoring.coreos.com/v1) and KEDA v2.20.2
# (keda.sh/v1alpha1) declare them (names, types, patterns, enums), and nothing else: like the API server's strict
# field validation, a field the CRD does not have (a typo) fails (docs/decisions.md, "The chart's custom resources").

_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}


def _strict(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


def _resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    metadata = _strict({"name": {"type": "string", "minLength": 1}, "namespace": {"type": "string"},
                        "labels": _LABELS, "annotations": _LABELS}, ("name",))
    return _strict({"apiVersion": {"const": api_version}, "kind": {"const": kind}, "metadata": metadata,
                    "spec": spec}, ("apiVersion", "kind", "metadata", "spec"))


_RULE = _strict({
    "record": {"type": "string"}, "alert": {"type": "string"}, "expr": {"type": ["string", "integer"]},
    "for": _DURATION, "keep_firing_for": _DURATION, "labels": _LABELS, "annotations": _LABELS,
}, ("expr",))

CUSTOM_RESOURCES: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _resource("monitoring.coreos.com/v1", "ServiceMonitor", _strict({
        "namespaceSelector": _strict({"any": {"type": "boolean"},
                                      "matchNames": {"type": "array", "items": {"type": "string"}}}),
        "selector": _strict({"matchLabels": _LABELS}),
        "endpoints": {"type": "array", "minItems": 1, "items": _strict({
            "port": {"type": "string"}, "path": {"type": "string"}, "interval": _DURATION,
            "relabelings": {"type": "array", "items": _strict({
                "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "labelmap", "LabelMap"]},
                "targetLabel": {"type": "string"}, "replacement": {"type": "string"},
                "sourceLabels": {"type": "array", "items": {"type": "string"}}, "regex": {"type": "string"},
            })},
        })},
    }, ("endpoints", "selector"))),
    ("monitoring.coreos.com/v1", "PrometheusRule"): _resource("monitoring.coreos.com/v1", "PrometheusRule", _strict({
        "groups": {"type": "array", "items": _strict({
            "name": {"type": "string", "minLength": 1}, "interval": _DURATION, "labels": _LABELS,
            "rules": {"type": "array", "items": _RULE},
        }, ("name",))},
    })),
    ("keda.sh/v1alpha1", "ScaledObject"): _resource("keda.sh/v1alpha1", "ScaledObject", _strict({
        "scaleTargetRef": _strict({"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                   "name": {"type": "string", "minLength": 1}}, ("name",)),
        "minReplicaCount": {"type": "integer", "minimum": 0}, "maxReplicaCount": {"type": "integer", "minimum": 1},
        "pollingInterval": {"type": "integer", "minimum": 1}, "cooldownPeriod": {"type": "integer", "minimum": 0},
        "triggers": {"type": "array", "minItems": 1, "items": _strict({
            "type": {"type": "string", "minLength": 1},
            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
            "authenticationRef": _strict({"name": {"type": "string"},
                                          "kind": {"enum": ["TriggerAuthentication", "ClusterTriggerAuthentication"]}},
                                         ("name",)),
        }, ("type", "metadata"))},
    }, ("scaleTargetRef", "triggers"))),
}

#: the trigger metadata KEDA's kafka scaler reads (v2.20.2, pkg/scalers/kafka_scaler.go), of those the chart may set
KAFKA_SCALER_METADATA = frozenset({
    "bootstrapServers", "consumerGroup", "topic", "lagThreshold", "activationLagThreshold", "offsetResetPolicy",
    "allowIdleConsumers", "excludePersistentLag", "limitToPartitionsWithLag", "sasl", "tls",
})


def validate(obj: dict[str, Any]) -> list[str]:
    """Problems of one rendered object (empty: none): a Kubernetes kind against the strict schemas of every version
    in KUBERNETES_VERSIONS, a custom resource against CUSTOM_RESOURCES."""
    custom = CUSTOM_RESOURCES.get((obj["apiVersion"], obj["kind"]))
    what = f"{obj['kind']} {obj['metadata']['name']}"
    if custom is not None:
        errors = sorted(jsonschema.Draft7Validator(custom).iter_errors(obj), key=lambda e: list(e.path))
        return [f"{what}: {'.'.join(map(str, e.path))}: {e.message}" for e in errors]
    problems = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{what} (Kubernetes {version}): {'.'.join(map(str, exc.path))}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(f"{what}: no schema in Kubernetes {version}: {exc.message}")
    return problems
