"""The dashboards and alert rules against real servers and a real Prometheus.

A dashboard panel whose query returns nothing, or an alert rule that can never fire, is a
defect no linter sees. So ``promtool`` lints a running server's ``/metrics``, and a real
Prometheus (Debian's ``prometheus``, on loopback) scrapes real servers under load, one healthy
and two driven into every alerting condition, plus the batch jobs' figures pushed to a real
Pushgateway (trading accounts among them, one halted by an injected mismatch): every PromQL
expression of the dashboards and the rules must return data there, with every alert pending or
firing where it should and only there.
"""

from __future__ import annotations

import json
import math
import shutil
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

from allocator.artifacts.manifest import checksums, write_manifest
from allocator.metrics.jobs import JobMetrics, PromotionDecision
from allocator.metrics.pushgateway import push_reporting
from allocator.metrics.trading import TRADE_JOB
from allocator.recording.migrations import upgrade
from allocator.serving.client import AllocatorClient, AllocatorError
from allocator.serving.server import AllocationServer, ServerConfig, build_server
from tests.monitoring.crashing import KILLS, CrashingWorkers
from tests.monitoring.files import (
    ALERTS,
    RETRAIN_JOB,
    WAIT,
    WALK_FORWARD_JOB,
    alert_rules,
    all_promql,
    annotation_scrape,
    promtool,
    require,
    shipped_server_scrape,
    unused_port,
)
from tests.monitoring.trading import trading_registries
from tests.serving import make_manifest
from tests.serving.conftest import TINY, action_icm_model, write_tiny_model
from tests.serving.conftest import redis_url as redis_url  # the session fixture
from tests.serving.load import LoadThread, wait_until


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
        threads=4,
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


JobRegistries = list[tuple[str, CollectorRegistry, dict[str, str]]]
"""``(job, registry, grouping key)`` of each push."""


def job_registries(now: float) -> JobRegistries:
    """A retraining run that last succeeded 5 days ago, and a fresh walk-forward run whose
    second window's actor collapsed."""
    retrain = CollectorRegistry()
    jobs = JobMetrics(retrain)
    jobs.record_promotion(PromotionDecision.PROMOTED)
    jobs.duration.observe(420.0)
    jobs.mark_success(now - 5 * 86400)
    walk_forward = CollectorRegistry()
    jobs = JobMetrics(walk_forward)
    jobs.record_window("2019-01-02", 0.8, {"collapsed": False, "last": {"near_bound_ratio": 0.1}})
    jobs.record_window("2020-01-02", -0.3, {"collapsed": True, "last": {"near_bound_ratio": 0.97}})
    jobs.duration.observe(1800.0)
    jobs.mark_success(now)
    return [(RETRAIN_JOB, retrain, {"model": "tiny"}), (WALK_FORWARD_JOB, walk_forward, {})]


def serve_job_metrics(tmp: Path, registries: JobRegistries) -> JobTargets:
    """Push to a real Pushgateway (scraped with honor_labels) when Debian's is installed."""
    binary = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")
    if binary is not None:
        address = f"127.0.0.1:{unused_port()}"
        gateway = Process.start(
            "pushgateway", [binary, f"--web.listen-address={address}"], tmp / "pushgateway.log"
        )
        gateway.wait_ready(f"http://{address}/-/ready")
        for job, registry, grouping in registries:
            assert push_reporting(registry, f"http://{address}", job, grouping or {}) is None
        config = {
            "job_name": "pushgateway",
            "honor_labels": True,
            "static_configs": [{"targets": [address]}],
        }
        return JobTargets([config], f"Pushgateway ({binary})", gateway.stop)
    servers = []
    by_job: dict[str, list[dict[str, Any]]] = {}
    for job, registry, grouping in registries:
        http, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
        servers.append(http)
        target = {"targets": [f"127.0.0.1:{http.server_port}"], "labels": grouping}
        by_job.setdefault(job, []).append(target)
    configs = [{"job_name": job, "static_configs": targets} for job, targets in by_job.items()]

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
    """Three servers (healthy, degraded, refusing), a two-worker supervisor whose worker keeps
    dying (crashing) and a dead target under the shipped compose scrape job, a second dead
    target labelled as annotation-based Kubernetes scraping labels it, the jobs' figures, and a
    Prometheus scraping them every second with the rules loaded."""

    api: PrometheusAPI
    instances: dict[str, str]
    jobs_how: str
    crashing: CrashingWorkers
    loads: list[LoadThread] = field(default_factory=list)


@pytest.fixture
def stack(tmp_path: Path, redis_url: str) -> Iterator[Stack]:
    prometheus_bin = require("prometheus")
    healthy_registry = tmp_path / "healthy-registry"
    write_tiny_model(healthy_registry / "tiny" / "1")
    novel_registry = novel_icm_registry(tmp_path / "novel-registry", offset=4.0)
    # A version whose model.onnx lost its second half: refused (checksum_mismatch) beside 1.
    truncated = write_tiny_model(novel_registry / "tiny" / "2") / "model.onnx"
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    stoppers: list[Callable[[], None]] = []
    loads: list[LoadThread] = []
    try:
        servers = {
            # SQLite recording, a 10 ms budget, the tiny model's ICM (median below 1).
            "healthy": start_server(healthy_registry, tmp_path / "healthy"),
            # Database down (spool grows, writes fail), a 1 us budget, ICM 4 deviations high,
            # a refused version in its registry.
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
        # --workers 2 under a supervisor whose worker 0 is killed each time it comes back.
        crashing = CrashingWorkers(healthy_registry, tmp_path / "crashing", redis_url)
        stoppers.append(crashing.stop)
        instances["crashing"] = f"127.0.0.1:{crashing.metrics_port}"
        instances["dead"] = f"127.0.0.1:{unused_port()}"
        instances["dead-annotated"] = f"127.0.0.1:{unused_port()}"
        trading = trading_registries(
            tmp_path / "trading", servers["healthy"].target, healthy_registry
        )
        jobs = serve_job_metrics(tmp_path, [*job_registries(time.time()), *trading])
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
        crashing.start_killing()
        window = TINY.window
        loads += [
            LoadThread(servers["healthy"].target, "healthy", window=window, rate=20.0),
            LoadThread(servers["healthy"].target, "batch", window=window, rate=5.0, batch=4),
            LoadThread(servers["degraded"].target, "degraded", window=window, rate=20.0, seed=1),
            LoadThread(servers["refusing"].target, "refusing", window=window, rate=10.0, seed=2),
        ]
        for load in loads:
            load.start()
        yield Stack(api, instances, jobs.how, crashing, loads)
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
        "AllocatorModelRefused": {inst["degraded"]},
        "AllocatorRetrainingStale": {""},
        "AllocatorActorCollapsed": {""},
        "AllocatorServingWorkersRestarting": {inst["crashing"]},
        "AllocatorTradingAccountHalted": {""},
        "AllocatorTradingTrackingDifference": {""},
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
    assert stack.crashing.error is None
    assert len(stack.crashing.killed) == KILLS
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
    collapsed = [a for a in api.alerts() if a["labels"]["alertname"] == "AllocatorActorCollapsed"]
    assert {a["labels"].get("window") for a in collapsed} == {"2020-01-02"}
    for name, accounts in {
        "AllocatorTradingAccountHalted": {"broken"},
        "AllocatorTradingTrackingDifference": {"slipping"},
    }.items():
        fired = [a for a in api.alerts() if a["labels"]["alertname"] == name]
        assert {a["labels"].get("account") for a in fired} == accounts, name
        assert {a["labels"].get("job") for a in fired} == {TRADE_JOB}, name
