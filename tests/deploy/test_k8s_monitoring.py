"""Kubernetes monitoring (``deploy/k8s/components/monitoring``), checked against the real files.

- ``kubectl kustomize`` renders the base with the monitoring and TLS components; every object
  validates: the built-in kinds against the Kubernetes schemas (``kubernetes-validate``,
  strict), the ServiceMonitor and PrometheusRule against the Prometheus Operator's schemas kept
  in ``tests/fixtures/k8s_schemas`` (``scripts/crd_schemas.py``), strict as well.
- The PrometheusRule and the dashboard ConfigMaps are what ``scripts/k8s_monitoring.py``
  renders from ``monitoring/`` now, and say the same as those files.
- The ServiceMonitor scrapes the metrics port of exactly the Service the alert rules find the
  servers by.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.helpers import (
    K8S,
    OLDEST_KUBERNETES,
    ROOT,
    kustomize,
    load_module,
    resource,
    validate_k8s,
)

COMPONENT = K8S / "components" / "monitoring"
SCHEMAS = ROOT / "tests" / "fixtures" / "k8s_schemas"
GENERATOR = load_module(ROOT / "scripts" / "k8s_monitoring.py")
SERVER_SERVICE = "allocator-server"
"""The ``service`` label of the servers' targets in monitoring/alerts.yml."""


def crd_validator(kind: str) -> jsonschema.Draft202012Validator:
    path = SCHEMAS / f"monitoring.coreos.com_v1_{kind.lower()}.json"
    schema = json.loads(path.read_text())
    return jsonschema.Draft202012Validator(schema)


def validate(obj: dict[str, Any]) -> None:
    """One rendered object against its schema: operator CRDs here, the rest built in."""
    if obj["apiVersion"] == "monitoring.coreos.com/v1":
        crd_validator(obj["kind"]).validate(obj)
    else:
        validate_k8s(obj, OLDEST_KUBERNETES)


def component_objects() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    return [
        doc
        for name in kustomization["resources"]
        for doc in yaml.safe_load_all((COMPONENT / name).read_text())
        if doc
    ]


def component_object(kind: str) -> dict[str, Any]:
    (found,) = [o for o in component_objects() if o["kind"] == kind]
    return found


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) not installed")
def test_kustomize_output_with_monitoring_validates(tmp_path: Path) -> None:
    objects = kustomize(K8S, K8S / "components/tls", COMPONENT, tmp_path=tmp_path)
    for obj in objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        assert obj["metadata"].get("namespace", "allocator") == "allocator", where
        try:
            validate(obj)
        except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as exc:
            pytest.fail(f"{where}: {exc}")
    kinds = [o["kind"] for o in objects]
    assert kinds.count("ServiceMonitor") == 1
    assert kinds.count("PrometheusRule") == 1
    dashboards = [o for o in objects if o["kind"] == "ConfigMap" and "grafana_dashboard" in (
        o["metadata"].get("labels", {})
    )]  # fmt: skip
    assert len(dashboards) == len(list((ROOT / "monitoring/dashboards").glob("*.json")))


def test_component_files_validate() -> None:
    """The same validation without kubectl: the component's objects as written."""
    kinds = []
    for obj in component_objects():
        validate(obj)
        kinds.append(obj["kind"])
    assert sorted(set(kinds)) == ["ConfigMap", "PrometheusRule", "ServiceMonitor"]


def test_the_crd_schemas_refuse_what_the_operator_would() -> None:
    """The passing validation above means something: these are refused."""
    monitor = component_object("ServiceMonitor")
    typo = copy.deepcopy(monitor)
    typo["spec"]["endpoints"][0]["intervall"] = "15s"  # unknown field
    bad_interval = copy.deepcopy(monitor)
    bad_interval["spec"]["endpoints"][0]["interval"] = "15 seconds"  # not a duration
    bad_scheme = copy.deepcopy(monitor)
    bad_scheme["spec"]["endpoints"][0]["scheme"] = "grpc"
    rule = component_object("PrometheusRule")
    unnamed = copy.deepcopy(rule)
    unnamed["spec"]["groups"][0]["name"] = ""
    misplaced = copy.deepcopy(rule)
    misplaced["spec"]["groups"][0]["rules"][0]["runbook_url"] = "docs/runbooks.md"
    for broken in (typo, bad_interval, bad_scheme, unnamed, misplaced):
        with pytest.raises(jsonschema.ValidationError):
            validate(broken)
    validate(monitor)
    validate(rule)


def test_generated_resources_are_current() -> None:
    stale = [str(p.relative_to(ROOT)) for p in GENERATOR.stale()]
    assert not stale, f"{stale} are stale: run python scripts/k8s_monitoring.py --write"


def test_prometheus_rule_holds_the_rule_file() -> None:
    rule = component_object("PrometheusRule")
    alerts = yaml.safe_load((ROOT / "monitoring/alerts.yml").read_text())
    assert rule["spec"]["groups"] == alerts["groups"]
    assert rule["metadata"]["namespace"] == "allocator"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_the_prometheus_rule_spec(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(component_object("PrometheusRule")["spec"]))
    result = subprocess.run(
        ["promtool", "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_config_maps_hold_the_dashboards() -> None:
    maps = [o for o in component_objects() if o["kind"] == "ConfigMap"]
    files = sorted((ROOT / "monitoring/dashboards").glob("*.json"))
    assert len(maps) == len(files)
    for config_map, path in zip(maps, files, strict=True):
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((key, text),) = config_map["data"].items()
        assert key == f"allocator-{path.stem}.json"
        assert json.loads(text) == json.loads(path.read_text())
    # kubectl apply keeps the last applied object in an annotation of at most 256 KiB.
    for config_map in maps:
        assert len(json.dumps(config_map)) < 200_000, config_map["metadata"]["name"]


def test_service_monitor_scrapes_the_metrics_port_of_the_server_service() -> None:
    monitor = component_object("ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["endpoints"]
    services = [
        resource("Service", name) for name in ("allocator-server", "allocator-server-headless")
    ]
    selected = [s for s in services if selector.items() <= s["metadata"]["labels"].items()]
    scraped = [s for s in selected if endpoint["port"] in {p["name"] for p in s["spec"]["ports"]}]
    # The operator labels each target with its Service's name: the label the rules select.
    assert [s["metadata"]["name"] for s in scraped] == [SERVER_SERVICE]
    deployment = resource("Deployment", "allocator-server")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    (port,) = [p for p in scraped[0]["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert ports[port["targetPort"]] == port["port"]
    assert monitor["metadata"]["namespace"] == scraped[0]["metadata"].get("namespace", "allocator")
    alerts = (ROOT / "monitoring/alerts.yml").read_text()
    assert f'up{{service="{SERVER_SERVICE}"}}' in alerts


def test_servers_are_scraped_through_the_service_only() -> None:
    """Pod annotations would add a second scrape of every server without the ``service``
    label: double sums on the dashboards and targets the rules do not see."""
    template = resource("Deployment", "allocator-server")["spec"]["template"]
    annotations = template["metadata"].get("annotations", {})
    assert not [key for key in annotations if key.startswith("prometheus.io/")]
    service = resource("Service", SERVER_SERVICE)
    metrics = next(p for p in service["spec"]["ports"] if p["name"] == "metrics")
    assert service["metadata"]["annotations"]["prometheus.io/port"] == str(metrics["port"])


def test_crd_schema_tightening() -> None:
    """What scripts/crd_schemas.py does to the models' schemas, on a small one."""
    tighten = load_module(ROOT / "scripts" / "crd_schemas.py").tighten
    loose = {
        "title": "Endpoint",
        "description": "prose",
        "type": "object",
        "properties": {
            "port": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            "target": {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]},
            "params": {"type": "object", "additionalProperties": {"type": "string"}},
            "empty": {"type": "object", "properties": {}},
        },
    }
    assert tighten(loose) == {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "port": {"type": "string"},
            "target": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            "params": {"type": "object", "additionalProperties": {"type": "string"}},
            "empty": {"type": "object", "properties": {}},
        },
    }
