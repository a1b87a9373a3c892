"""What the monitoring tests share: the files in ``monitoring/`` and what they ask for (their
PromQL and SQL, the metric names they may use), and the real tools (``promtool``).

The binaries come from Debian (``prometheus``, ``prometheus-pushgateway``); ``.ci/run`` installs
them. Without them the tests skip, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from allocator.metrics.jobs import JobMetrics
from allocator.metrics.recorder import RecorderMetrics
from allocator.metrics.serving import ServingMetrics, worker_restarts_counter
from allocator.metrics.trading import TradingMetrics
from allocator.serving.server import SERVICE

REPO_ROOT = Path(__file__).resolve().parents[2]
MONITORING = REPO_ROOT / "monitoring"
ALERTS = MONITORING / "alerts.yml"
ALERTS_TEST = MONITORING / "alerts_test.yml"
DASHBOARDS = {
    name: MONITORING / "dashboards" / f"{name}.json"
    for name in ("serving", "trading", "validation")
}

SHIPPED_PROMETHEUS = REPO_ROOT / "deploy" / "prometheus" / "prometheus.yml"
SERVER_JOB = "allocator-server"
"""The compose stack's scrape job of the allocation servers (deploy/prometheus)."""
SERVER_SERVICE = "allocator-server"
"""The ``service`` label the rules find the servers by: the Kubernetes Service's name, which
the ServiceMonitor and annotation-based scraping both copy, and a static label in compose."""
ANNOTATION_JOB = "kubernetes-service-endpoints"
"""The job name of the common annotation-based scrape config (Prometheus' Helm chart)."""
RETRAIN_JOB = "allocator_retrain"
WALK_FORWARD_JOB = "allocator_walk_forward"
GRAFANA_INTERVALS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m"}
"""Grafana's built-in interval variables, as they would be at a 1 s scrape interval (at most)."""
WAIT = 90.0
"""Upper bound of a poll for something that takes a few scrapes (1 s each)."""


def require(binary: str) -> str:
    """The binary's path; skip without it (fail under CI, which installs it)."""
    path = shutil.which(binary)
    if path is None:
        message = (
            f"{binary} is not installed (Debian: apt-get install -y --no-install-recommends "
            "prometheus prometheus-pushgateway; .ci/run does it)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path


def unused_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def promtool(*args: str, stdin: bytes | None = None, cwd: Path | None = None) -> str:
    """Run promtool; fail with its output unless it exits 0."""
    result = subprocess.run(
        [require("promtool"), *args],
        input=stdin,
        capture_output=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )
    output = (result.stdout + result.stderr).decode()
    assert result.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


# --- what the files ask for ----------------------------------------------------------------


def load_dashboard(name: str) -> dict[str, Any]:
    return json.loads(DASHBOARDS[name].read_text())


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those inside collapsed rows."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def variables(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return list(dashboard.get("templating", {}).get("list", []))


def datasource_kind(dashboard: dict[str, Any], ref: dict[str, Any] | None) -> str:
    """``prometheus`` or ``postgres``: the plugin behind a ``${variable}`` datasource ref."""
    assert ref is not None, "a panel or target without a datasource"
    uid = ref["uid"]
    match = re.fullmatch(r"\$\{(\w+)\}", uid)
    assert match, f"datasource uid {uid!r} is not one of the dashboard's datasource variables"
    plugins = {v["name"]: v["query"] for v in variables(dashboard) if v["type"] == "datasource"}
    plugin = plugins[match.group(1)]
    return "postgres" if "postgres" in plugin else plugin


def prometheus_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """``(where, PromQL)`` of every Prometheus target and query variable, with Grafana's
    variables replaced as an "All" selection would (``label_values`` becomes a ``count by``)."""
    values = dict(GRAFANA_INTERVALS)
    queries: list[tuple[str, str]] = []
    for var in variables(dashboard):
        if var["type"] == "query" and datasource_kind(dashboard, var["datasource"]) == "prometheus":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query.strip())
            assert match, f"variable {var['name']}: unsupported query {query!r}"
            queries.append((f"variable {var['name']}", f"count by ({match[2]}) ({match[1]})"))
            values[f"${var['name']}"] = var["allValue"]
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            ref = target.get("datasource") or panel.get("datasource")
            if datasource_kind(dashboard, ref) != "prometheus":
                continue
            expr = target["expr"]
            for name in sorted(values, key=len, reverse=True):  # $__range before $__r...
                expr = expr.replace(name, values[name])
            assert "$" not in expr, f"{panel['title']}: unresolved variable in {expr}"
            queries.append((f"{panel['title']} [{target['refId']}]", expr))
    return queries


def sql_queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(where, format, SQL)`` of every Postgres target and query variable, unsubstituted."""
    queries: list[tuple[str, str, str]] = []
    for var in variables(dashboard):
        if var["type"] == "query" and datasource_kind(dashboard, var["datasource"]) == "postgres":
            queries.append((f"variable {var['name']}", "table", var["query"]))
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            ref = target.get("datasource") or panel.get("datasource")
            if datasource_kind(dashboard, ref) == "postgres":
                where = f"{panel['title']} [{target['refId']}]"
                queries.append((where, target["format"], target["rawSql"]))
    return queries


def shipped_server_scrape(targets: list[str]) -> dict[str, Any]:
    """The servers' scrape job of deploy/prometheus/prometheus.yml, pointed at ``targets``:
    the rules meet the labels the shipped configuration gives, not ones made up here."""
    config = yaml.safe_load(SHIPPED_PROMETHEUS.read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == SERVER_JOB)
    (static,) = job["static_configs"]
    return {**job, "static_configs": [{**static, "targets": targets}]}


def annotation_scrape(targets: list[str]) -> dict[str, Any]:
    """Targets labelled as annotation-based Kubernetes scraping labels them: another job name,
    ``service`` and ``namespace`` from the discovered Service."""
    labels = {"service": SERVER_SERVICE, "namespace": "allocator"}
    return {"job_name": ANNOTATION_JOB, "static_configs": [{"targets": targets, "labels": labels}]}


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def all_promql() -> list[tuple[str, str]]:
    """Every PromQL expression the dashboards and the alert rules use."""
    queries = [
        (f"{name}: {where}", expr)
        for name in DASHBOARDS
        for where, expr in prometheus_queries(load_dashboard(name))
    ]
    queries += [(f"alert {rule['alert']}", rule["expr"]) for rule in alert_rules()]
    return queries


def defined_metric_names() -> set[str]:
    """The sample names the metric classes expose (with histogram and counter suffixes)."""
    registry = CollectorRegistry()
    ServingMetrics(registry, 0.01, SERVICE)
    RecorderMetrics(registry)
    JobMetrics(registry).mark_success()  # the last-success gauge exists once a run succeeded
    worker_restarts_counter(registry)  # the supervisor's, with --workers N
    TradingMetrics(registry)  # pushed by `allocator trade`
    names = {"up"}
    for family in registry.collect():
        names.add(family.name)
        suffixes = ("_total", "_bucket", "_count", "_sum", "_info")
        names.update(f"{family.name}{suffix}" for suffix in suffixes)
    return names
