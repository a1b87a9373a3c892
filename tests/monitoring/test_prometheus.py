"""The dashboards and alert rules in ``monitoring/``, checked by the real tools.

A dashboard panel whose query returns nothing, or an alert rule that can never fire, is a
defect no linter sees. So: ``promtool`` checks and unit-tests the rules and lints a running
server's ``/metrics``; a real Prometheus (Debian's ``prometheus``, on loopback) scrapes real
servers under load, one healthy and two driven into every alerting condition, plus the batch
jobs' figures pushed to a real Pushgateway, and every PromQL expression of the dashboards and
the rules must return data there, with every alert pending or firing where it should and only
there. The validation dashboard's SQL runs against the migrated schema on a real Postgres.

The binaries come from Debian (``prometheus``, ``prometheus-pushgateway``); ``.ci/run`` installs
them. Without them the tests skip, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml
from onnx import helper, numpy_helper
from prometheus_client import CollectorRegistry, start_http_server
from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from allocator.artifacts.manifest import checksums, write_manifest
from allocator.metrics.jobs import JobMetrics, PromotionDecision
from allocator.metrics.pushgateway import push
from allocator.metrics.recorder import RecorderMetrics
from allocator.metrics.serving import ServingMetrics
from allocator.recording.migrations import upgrade
from allocator.recording.schema import ModelVersion, Promotion, WalkForwardRun, WalkForwardWindow
from allocator.serving.client import AllocatorClient, AllocatorError
from allocator.serving.server import AllocationServer, ServerConfig, build_server
from tests.postgres import reset_schema
from tests.serving import make_manifest
from tests.serving.conftest import TINY, action_icm_model, write_tiny_model
from tests.serving.load import LoadThread, wait_until
from tests.test_docs import anchors

REPO_ROOT = Path(__file__).resolve().parents[2]
MONITORING = REPO_ROOT / "monitoring"
ALERTS = MONITORING / "alerts.yml"
ALERTS_TEST = MONITORING / "alerts_test.yml"
DASHBOARDS = {
    name: MONITORING / "dashboards" / f"{name}.json" for name in ("serving", "validation")
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
    ServingMetrics(registry, 0.01)
    RecorderMetrics(registry)
    JobMetrics(registry).mark_success()  # the last-success gauge exists once a run succeeded
    names = {"up"}
    for family in registry.collect():
        names.add(family.name)
        suffixes = ("_total", "_bucket", "_count", "_sum", "_info")
        names.update(f"{family.name}{suffix}" for suffix in suffixes)
    return names


# --- static checks -------------------------------------------------------------------------


def test_alert_rules_pass_promtool_check() -> None:
    output = promtool("check", "rules", str(ALERTS))
    assert f"SUCCESS: {len(alert_rules())} rules found" in output


def test_alert_rules_pass_their_promtool_unit_tests() -> None:
    promtool("test", "rules", ALERTS_TEST.name, cwd=MONITORING)


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    cases: dict[str, list[bool]] = {}
    for group in yaml.safe_load(ALERTS_TEST.read_text())["tests"]:
        for case in group.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], []).append(bool(case.get("exp_alerts")))
    for rule in alert_rules():
        outcomes = cases.get(rule["alert"], [])
        assert True in outcomes, f"{rule['alert']}: no unit test where it fires"
        assert False in outcomes, f"{rule['alert']}: no unit test where it stays quiet"


def test_every_alert_links_its_runbook_section() -> None:
    for rule in alert_rules():
        url = rule["annotations"].get("runbook_url", "")
        path, _, anchor = url.partition("#")
        assert path.startswith("docs/"), f"{rule['alert']}: runbook_url {url!r} not into docs/"
        document = REPO_ROOT / path
        assert document.is_file(), f"{rule['alert']}: {path} does not exist"
        assert anchor in anchors(document), f"{rule['alert']}: no section #{anchor} in {path}"


def test_server_rules_select_the_service_label_not_a_job_name() -> None:
    """Scrape configs name the job differently (compose, ServiceMonitor, annotations); the
    Service's name is what they share, so a rule that selects a job name fires forever under
    the others (``absent``) or never."""
    for where, expr in all_promql():
        assert 'job="allocator-server"' not in expr, where
    (down,) = [r for r in alert_rules() if r["alert"] == "AllocatorServerDown"]
    selector = f'up{{service="{SERVER_SERVICE}"}}'
    assert down["expr"].split() == [selector, "==", "0", "or", f"absent({selector})"]
    shipped = shipped_server_scrape(["x:1"])["static_configs"][0]
    assert shipped["labels"]["service"] == SERVER_SERVICE


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_is_well_formed(name: str) -> None:
    dashboard = load_dashboard(name)
    assert dashboard["uid"] == f"allocator-{name}"
    assert dashboard["title"]
    assert dashboard["schemaVersion"] >= 36
    ids = [panel["id"] for panel in all_panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in all_panels(dashboard):
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        if panel["type"] == "row":
            continue
        assert panel.get("description"), f"{panel['title']}: say what the panel shows"
        refs = [t["refId"] for t in panel["targets"]]
        assert refs, f"{panel['title']}: no queries"
        assert len(refs) == len(set(refs)), f"{panel['title']}: refIds {refs}"
        for target in panel["targets"]:
            datasource_kind(dashboard, target.get("datasource") or panel.get("datasource"))


def test_queries_name_only_metrics_that_exist() -> None:
    """A typo in a metric name returns nothing without an error: catch it before Prometheus."""
    known = defined_metric_names()
    for where, expr in all_promql():
        code = re.sub(r'"[^"]*"', '""', expr)  # label values are not metric names
        for metric in re.findall(r"\b(allocator_[a-z_]+|up)\b", code):
            assert metric in known, f"{where}: unknown metric {metric} in {expr}"


# --- servers -------------------------------------------------------------------------------


def novel_icm_registry(root: Path, offset: float) -> Path:
    """A registry whose ICM reward is the tiny model's plus ``offset`` training deviations."""
    directory = write_tiny_model(root / "tiny" / "1")
    model = action_icm_model(TINY)
    graph = model.graph
    graph.node[-1].output[0] = "unshifted"
    graph.node.append(helper.make_node("Add", ["unshifted", "offset"], ["intrinsic_reward"]))
    graph.initializer.append(numpy_helper.from_array(np.array(offset, np.float32), "offset"))
    (directory / "icm.onnx").write_bytes(model.SerializeToString())
    names = ["model.onnx", "icm.onnx"]
    write_manifest(directory, make_manifest(TINY, checksums(directory, names), icm=True))
    return root


def start_server(registry: Path, tmp: Path, **overrides: Any) -> AllocationServer:
    """A started server with /metrics on a free port; SQLite recording unless overridden."""
    tmp.mkdir(parents=True, exist_ok=True)
    if "database_url" not in overrides:
        overrides["database_url"] = f"sqlite:///{tmp / 'trades.db'}"
        upgrade(overrides["database_url"])
    config = ServerConfig(
        registry=registry,
        port=0,
        metrics_port=0,
        spool_dir=tmp / "spool",
        prefer_cuda=False,
        workers=4,
        reload_interval=60.0,
        grace_seconds=1.0,
        drain_seconds=0.2,
        **overrides,
    )
    return build_server(config).start()


def unreachable_database() -> str:
    """A Postgres URL nobody listens on: the recorder spools everything and retries."""
    return f"postgresql+psycopg://allocator@127.0.0.1:{unused_port()}/allocator"


def fetch(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return bytes(reply.read())


def test_server_metrics_pass_promtool_check_metrics(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    write_tiny_model(registry / "tiny" / "1")
    server = start_server(registry, tmp_path / "server")
    try:
        load = LoadThread(server.target, "lint", window=TINY.window, rate=50.0)
        batch = LoadThread(server.target, "lint-batch", window=TINY.window, rate=20.0, batch=3)
        with AllocatorClient(server.target, timeout=10.0) as client:
            for thread in (load, batch):
                thread.start()
            wait_until(lambda: len(load.ok) >= 5 and len(batch.ok) >= 2, WAIT, "requests")
            load.stop()
            batch.stop()
            with pytest.raises(AllocatorError):
                client.allocate("lint", ["A"], np.full((1, TINY.window + 1), -1.0))
        load.join(10)
        batch.join(10)
        assert server.recorder is not None
        assert server.recorder.flush(WAIT)
        text = fetch(f"http://127.0.0.1:{server.metrics_port}/metrics")
    finally:
        server.stop()
    assert b'grpc_code="INVALID_ARGUMENT"' in text
    assert b"allocator_serving_batch_size_bucket" in text
    promtool("check", "metrics", stdin=text)


# --- a real Prometheus ---------------------------------------------------------------------


@dataclass
class Process:
    """A child process logging to a file; ``stop`` ends it (terminate, then kill)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, name: str, args: list[str], log: Path) -> Process:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        return cls(name, proc, log)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])

    def wait_ready(self, url: str) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                fetch(url, timeout=2.0)
            except OSError:
                return False
            return True

        wait_until(ready, WAIT, f"{self.name} at {url}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@dataclass
class JobTargets:
    """Where Prometheus finds the batch jobs' figures: a Pushgateway, or (without the binary)
    each job's registry served over HTTP as its own target."""

    scrape_configs: list[dict[str, Any]]
    how: str
    stop: Callable[[], None]


def job_registries(now: float) -> dict[str, tuple[CollectorRegistry, dict[str, str]]]:
    """A retraining run that last succeeded 5 days ago, and a fresh walk-forward run."""
    retrain = CollectorRegistry()
    jobs = JobMetrics(retrain)
    jobs.record_promotion(PromotionDecision.PROMOTED)
    jobs.observe_duration(420.0)
    jobs.mark_success(now - 5 * 86400)
    walk_forward = CollectorRegistry()
    jobs = JobMetrics(walk_forward)
    jobs.record_window("2019-01-02", 0.8)
    jobs.record_window("2020-01-02", -0.3)
    jobs.observe_duration(1800.0)
    jobs.mark_success(now)
    return {RETRAIN_JOB: (retrain, {"model": "tiny"}), WALK_FORWARD_JOB: (walk_forward, {})}


def serve_job_metrics(tmp: Path) -> JobTargets:
    """Push to a real Pushgateway (scraped with honor_labels) when Debian's is installed."""
    registries = job_registries(time.time())
    binary = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")
    if binary is not None:
        address = f"127.0.0.1:{unused_port()}"
        gateway = Process.start(
            "pushgateway", [binary, f"--web.listen-address={address}"], tmp / "pushgateway.log"
        )
        gateway.wait_ready(f"http://{address}/-/ready")
        for job, (registry, grouping) in registries.items():
            push(registry, f"http://{address}", job, grouping_key=grouping or None)
        config = {
            "job_name": "pushgateway",
            "honor_labels": True,
            "static_configs": [{"targets": [address]}],
        }
        return JobTargets([config], f"Pushgateway ({binary})", gateway.stop)
    servers = []
    configs = []
    for job, (registry, grouping) in registries.items():
        http, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
        servers.append(http)
        target = {"targets": [f"127.0.0.1:{http.server_port}"], "labels": grouping}
        configs.append({"job_name": job, "static_configs": [target]})

    def stop() -> None:
        for http in servers:
            http.shutdown()

    return JobTargets(configs, "prometheus_client HTTP servers (no Pushgateway binary)", stop)


class PrometheusAPI:
    """The few calls of Prometheus' HTTP API the checks need."""

    def __init__(self, base: str) -> None:
        self.base = base

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        try:
            body = json.loads(fetch(url))
        except urllib.error.HTTPError as error:
            body = json.loads(error.read() or b"{}")
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", f"{expr}: {data['resultType']}"
        return list(data["result"])

    def targets(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/targets")["activeTargets"])

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/alerts")["alerts"])

    def rules(self) -> list[dict[str, Any]]:
        return [r for g in self.get("/api/v1/rules")["groups"] for r in g["rules"]]


def has_finite_sample(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(sample["value"][1])) for sample in result)


@dataclass
class Stack:
    """Three servers (healthy, degraded, refusing) and a dead target under the shipped compose
    scrape job, a second dead target labelled as annotation-based Kubernetes scraping labels
    it, the jobs' figures, and a Prometheus scraping them every second with the rules loaded."""

    api: PrometheusAPI
    instances: dict[str, str]
    jobs_how: str
    loads: list[LoadThread] = field(default_factory=list)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    prometheus_bin = require("prometheus")
    healthy_registry = tmp_path / "healthy-registry"
    write_tiny_model(healthy_registry / "tiny" / "1")
    novel_registry = novel_icm_registry(tmp_path / "novel-registry", offset=4.0)
    stoppers: list[Callable[[], None]] = []
    loads: list[LoadThread] = []
    try:
        servers = {
            # SQLite recording, a 10 ms budget, the tiny model's ICM (median below 1).
            "healthy": start_server(healthy_registry, tmp_path / "healthy"),
            # Database down (spool grows, writes fail), a 1 us budget, ICM 4 deviations high.
            "degraded": start_server(
                novel_registry,
                tmp_path / "degraded",
                database_url=unreachable_database(),
                latency_budget_ms=0.001,
            ),
            # Database down with a 1-byte spool quota: every decision refused (UNAVAILABLE).
            "refusing": start_server(
                healthy_registry,
                tmp_path / "refusing",
                database_url=unreachable_database(),
                spool_quota_bytes=1,
            ),
        }
        for server in servers.values():
            stoppers.append(lambda server=server: server.stop(grace=1.0))
        instances = {name: f"127.0.0.1:{s.metrics_port}" for name, s in servers.items()}
        instances["dead"] = f"127.0.0.1:{unused_port()}"
        instances["dead-annotated"] = f"127.0.0.1:{unused_port()}"
        jobs = serve_job_metrics(tmp_path)
        stoppers.append(jobs.stop)

        address = f"127.0.0.1:{unused_port()}"
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(ALERTS)],
            "scrape_configs": [
                shipped_server_scrape([v for k, v in instances.items() if k != "dead-annotated"]),
                annotation_scrape([instances["dead-annotated"]]),
                *jobs.scrape_configs,
            ],
        }
        config_file = tmp_path / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config))
        prometheus = Process.start(
            "prometheus",
            [
                prometheus_bin,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address={address}",
                "--log.level=warn",
            ],
            tmp_path / "prometheus.log",
        )
        stoppers.append(prometheus.stop)
        prometheus.wait_ready(f"http://{address}/-/ready")
        api = PrometheusAPI(f"http://{address}")

        def all_scraped() -> bool:
            targets = api.targets()
            return len(targets) == len(instances) + len(jobs.scrape_configs) and all(
                t["health"] != "unknown" for t in targets
            )

        wait_until(all_scraped, WAIT, "a first scrape of every target")
        window = TINY.window
        loads += [
            LoadThread(servers["healthy"].target, "healthy", window=window, rate=20.0),
            LoadThread(servers["healthy"].target, "batch", window=window, rate=5.0, batch=4),
            LoadThread(servers["degraded"].target, "degraded", window=window, rate=20.0, seed=1),
            LoadThread(servers["refusing"].target, "refusing", window=window, rate=10.0, seed=2),
        ]
        for load in loads:
            load.start()
        yield Stack(api, instances, jobs.how, loads)
    finally:
        for load in loads:
            load.stop()
            load.join(10)
        for stop in reversed(stoppers):
            stop()


def test_dashboards_and_alerts_against_a_real_prometheus(stack: Stack) -> None:
    """One test, one stack: setting it up is the expensive part (about 15 s)."""
    check_every_query_returns_data(stack)
    check_every_alert_is_active_where_it_should_be(stack)


def check_every_query_returns_data(stack: Stack) -> None:
    queries = all_promql()
    api = stack.api
    empty: dict[str, str] = dict(queries)

    def all_answered() -> bool:
        for where, expr in list(empty.items()):
            if has_finite_sample(api.query(expr)):
                del empty[where]
        return not empty

    try:
        wait_until(all_answered, WAIT, "data for every query")
    except AssertionError:
        listing = "\n".join(f"  {where}: {expr}" for where, expr in empty.items())
        raise AssertionError(
            f"{len(empty)} of {len(queries)} queries returned no data ({stack.jobs_how}):\n"
            f"{listing}"
        ) from None
    for load in stack.loads:
        assert load.error is None, f"{load.name}: {load.error!r}"
    codes = {o.code for o in stack.loads[3].outcomes}
    assert grpc.StatusCode.UNAVAILABLE in codes, "the refusing server never refused"


def check_every_alert_is_active_where_it_should_be(stack: Stack) -> None:
    api = stack.api
    inst = stack.instances
    expected = {
        "AllocatorServerDown": {inst["dead"], inst["dead-annotated"]},
        "AllocatorLatencyP95OverBudget": {inst["degraded"]},
        "AllocatorHighErrorRate": {inst["refusing"]},
        "AllocatorIcmNoveltyHigh": {inst["degraded"]},
        "AllocatorRecorderWritesFailing": {inst["degraded"], inst["refusing"]},
        "AllocatorRecorderSpoolGrowing": {inst["degraded"]},
        "AllocatorRecorderRefusing": {inst["refusing"]},
        "AllocatorRetrainingStale": {""},
    }
    assert set(expected) == {rule["alert"] for rule in alert_rules()}

    def active() -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for alert in api.alerts():
            if alert["state"] in {"pending", "firing"}:
                labels = alert["labels"]
                found.setdefault(labels["alertname"], set()).add(labels.get("instance", ""))
        return found

    def all_active() -> bool:
        found = active()
        return all(want <= found.get(name, set()) for name, want in expected.items())

    try:
        wait_until(all_active, WAIT, "every alert pending or firing")
    except AssertionError:
        raise AssertionError(f"active alerts {active()}, expected at least {expected}") from None
    for rule in api.rules():
        assert rule["health"] == "ok", f"{rule['name']}: {rule.get('lastError')}"
    # Deterministic quiet cases: the healthy server records, answers and sees familiar
    # markets. (Its P95 against 10 ms depends on the machine, so it is not asserted.)
    found = active()
    for name in expected:
        if name != "AllocatorLatencyP95OverBudget":
            assert inst["healthy"] not in found.get(name, set()), f"{name} on the healthy server"
    retrain = [a for a in api.alerts() if a["labels"]["alertname"] == "AllocatorRetrainingStale"]
    assert {a["labels"].get("job") for a in retrain} == {RETRAIN_JOB}
    assert {a["labels"].get("model") for a in retrain} == {"tiny"}


# --- the validation dashboard's SQL on Postgres --------------------------------------------


def grafana_sql(raw: str, run_id: int, start: dt.datetime, end: dt.datetime) -> str:
    """Grafana's macros and this dashboard's variables, as Grafana would expand them."""
    frm, to = start.isoformat(), end.isoformat()
    # $__timeFilter takes one column here (no nested parentheses).
    text = re.sub(r"\$__timeFilter\(([^)]+)\)", rf"\1 BETWEEN '{frm}' AND '{to}'", raw)
    text = text.replace("$run", str(run_id)).replace("$model", "'allocator'")
    assert "$" not in text, f"unresolved Grafana variable in:\n{text}"
    return text


def seed_validation_rows(url: str) -> int:
    """One walk-forward run of two windows and two promotion decisions, shaped as the
    walk-forward store and the retraining job write them (metric and gate keys included)."""
    now = dt.datetime.now(dt.UTC)
    baselines = ("equal-weight", "buy-and-hold", "min-variance", "hrp")
    engine = create_engine(url, poolclass=NullPool)
    with Session(engine) as session, session.begin():
        version = ModelVersion(name="allocator", version="3", algorithm="td3", manifest={})
        run = WalkForwardRun(
            name="wf-test",
            config={},
            finished=now,
            summary={
                "positive_sharpe": 0.5,
                "beats_equal_weight": 0.5,
                "median_excess_sharpe": 0.1,
                "mean_turnover": 0.04,
            },
        )
        session.add_all([version, run])
        session.flush()
        for index, sharpe in enumerate((0.9, -0.2)):
            start = dt.date(2019 + index, 1, 1)
            session.add(
                WalkForwardWindow(
                    run_id=run.id,
                    index=index,
                    train_start=start - dt.timedelta(days=730),
                    train_end=start - dt.timedelta(days=1),
                    test_start=start,
                    test_end=start + dt.timedelta(days=180),
                    model_version_id=version.id,
                    metrics={
                        "sharpe": sharpe,
                        "sortino": sharpe * 1.3,
                        "max_drawdown": 0.12,
                        "turnover": 0.05,
                        "excess_sharpe": sharpe - 0.4,
                        "regime": "bull",
                    },
                    baseline_metrics={
                        name: {"sharpe": 0.4 + 0.1 * k} for k, name in enumerate(baselines)
                    },
                )
            )
        for days_ago, promoted in ((10, True), (3, False)):
            gate = {"gate": "sharpe", "passed": promoted, "reason": "vs serving", "value": 0.1}
            session.add(
                Promotion(
                    model_name="allocator",
                    candidate_version=str(4 + days_ago),
                    production_version="3",
                    decided_at=now - dt.timedelta(days=days_ago),
                    promoted=promoted,
                    reasons=[gate, {**gate, "gate": "drawdown", "passed": True}],
                    candidate_metrics={"sharpe": 1.1},
                    production_metrics={"sharpe": 0.9},
                    train_start=dt.date(2018, 1, 1),
                    train_end=dt.date(2021, 12, 31),
                    holdout_start=dt.date(2022, 1, 3),
                    holdout_end=dt.date(2022, 6, 30),
                    details={},
                )
            )
        run_id = int(run.id)
    engine.dispose()
    return run_id


def test_validation_dashboard_sql_returns_rows_on_postgres(postgres_url: str) -> None:
    reset_schema(postgres_url)  # the session's database, emptied, then migrated
    upgrade(postgres_url)
    engine = create_engine(postgres_url, poolclass=NullPool)
    run_id = seed_validation_rows(postgres_url)
    now = dt.datetime.now(dt.UTC)
    queries = sql_queries(load_dashboard("validation"))
    assert len(queries) >= 6
    with engine.connect() as conn:
        for where, fmt, raw in queries:
            result = conn.exec_driver_sql(grafana_sql(raw, run_id, now - dt.timedelta(90), now))
            columns = list(result.keys())
            rows = result.fetchall()
            assert rows, f"{where}: no rows"
            if fmt == "time_series":
                assert {"time", "metric", "value"} <= set(columns), f"{where}: {columns}"
            if "against the baselines" in where:
                policies = {row.policy for row in rows}
                assert policies == {"agent", "equal-weight", "buy-and-hold", "min-variance", "hrp"}
                assert len(rows) == 2 * len(policies)
            if "reasons" in where:
                failed = {row.decision: row[columns.index("failed gates")] for row in rows}
                assert failed == {"promoted": None, "rejected": "sharpe: vs serving"}
    engine.dispose()
