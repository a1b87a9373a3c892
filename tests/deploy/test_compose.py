"""The compose file: builds, mounts, dependencies, ports, the commands through the real CLI, the
Prometheus and Grafana wiring; ``promtool check config`` when promtool is installed.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.helpers import (
    COMPOSE_FILE,
    DEPLOY,
    ROOT,
    parse_cli,
    server_config,
)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def service_argv(service: dict[str, Any], image_entrypoint: list[str]) -> list[str]:
    entrypoint = service.get("entrypoint", image_entrypoint)
    return [*entrypoint, *service.get("command", [])]


def host_path(source: str) -> Path:
    return (COMPOSE_FILE.parent / source).resolve()


def bind_mounts(service: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            yield source, target


def test_compose_services_builds_mounts_and_dependencies(compose):
    services = compose["services"]
    assert {"postgres", "redis", "migrations", "server", "prometheus", "grafana", "retrain"} <= set(
        services
    )
    named = set(compose.get("volumes", {}))
    host_ports: list[str] = []
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        if "build" in service:
            context = host_path(service["build"]["context"])
            assert (context / service["build"]["dockerfile"]).is_file(), name
            assert context == ROOT, f"{name}: build from the repository root (.dockerignore)"
        else:
            repo, _, tag = service["image"].rpartition(":")
            assert repo, name
            assert tag not in {"", "latest"}, f"{name}: pin the image tag"
        for source, _ in bind_mounts(service):
            assert host_path(source).exists(), f"{name}: {source} does not exist"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in named, f"{name}: volume {source} is not declared"
        for dependency, rule in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            assert rule["condition"] in {
                "service_started",
                "service_healthy",
                "service_completed_successfully",
            }
            if rule["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency] or dependency in {"server"}
            if rule["condition"] == "service_completed_successfully":
                assert services[dependency].get("restart") == "no"
            if "profiles" not in service:
                assert "profiles" not in services[dependency], f"{name} needs a profiled service"
        host_ports += [str(p).rsplit(":", 1)[0] for p in service.get("ports", [])]
    assert len(host_ports) == len(set(host_ports)), f"host ports collide: {host_ports}"


def test_compose_server_command_and_wiring(compose):
    services = compose["services"]
    server = services["server"]
    command, params = parse_cli(service_argv(server, ["allocator", "serve"]))
    assert command == "serve"
    config = server_config(params, server["environment"])
    assert config.host == "0.0.0.0"
    published = {str(p).rsplit(":", 1)[-1] for p in server["ports"]}
    assert {str(config.port), str(config.metrics_port)} <= published
    targets = {v.split(":")[1]: v for v in server["volumes"]}
    assert targets[str(config.registry)].endswith(":ro")
    assert str(config.spool_dir) in targets
    assert config.redis_url is not None
    assert config.redis_url.split("//")[1].split(":")[0] in services
    database_url = server["environment"]["DATABASE_URL"]
    assert database_url.split("@")[1].split(":")[0] in services
    deps = server["depends_on"]
    assert deps["migrations"]["condition"] == "service_completed_successfully"
    assert {"redis", "postgres"} <= deps.keys()

    migrations = services["migrations"]
    command, params = parse_cli(service_argv(migrations, ["allocator", "serve"]))
    assert (command, params["revision"]) == ("db.upgrade", "head")
    assert migrations["environment"]["DATABASE_URL"] == database_url
    assert migrations["image"] == server["image"]
    assert migrations["build"] == server["build"]


def test_compose_jobs_run_valid_configs(compose, monkeypatch):
    from allocator.trainer.jobs.retrain.config import load_retrain_config
    from allocator.trainer.jobs.walk_forward.config import load_walk_forward_config

    services = compose["services"]
    monkeypatch.chdir(ROOT)  # the trainer image's working directory is the checkout's root
    command, params = parse_cli(service_argv(services["retrain"], []))
    assert command == "retrain"
    assert services["retrain"]["profiles"] == ["jobs"]
    for name, value in services["retrain"]["environment"].items():
        monkeypatch.setenv(name, value)
    retrain = load_retrain_config(params["config_path"], list(params["overrides"]))
    mounted = {v.split(":")[1]: v.split(":")[0] for v in services["retrain"]["volumes"]}
    server_mounts = {v.split(":")[1]: v.split(":")[0] for v in services["server"]["volumes"]}
    # The job writes the very volume the server reads its registry from.
    assert mounted[str(retrain.registry)] == server_mounts["/models"]
    assert retrain.pushgateway_url == "http://pushgateway:9091"

    command, params = parse_cli(service_argv(services["walk-forward"], []))
    assert command == "walk-forward"
    walk = load_walk_forward_config(params["config_path"], list(params["overrides"]))
    assert not walk.registry.startswith("/models"), "keep its models out of the serving registry"


def test_prometheus_scrapes_the_compose_services_and_loads_the_rules(compose):
    services = compose["services"]
    prometheus = services["prometheus"]
    config_mount = next(t for s, t in bind_mounts(prometheus) if s.endswith("prometheus.yml"))
    assert f"--config.file={config_mount}" in prometheus["command"]
    config = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
    rules_target = next(t for s, t in bind_mounts(prometheus) if s.endswith("alerts.yml"))
    assert any(fnmatch.fnmatch(rules_target, pattern) for pattern in config["rule_files"])
    jobs = {}
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            for target in static["targets"]:
                host, port = target.rsplit(":", 1)
                assert host in services or host == "localhost", target
                jobs[job["job_name"]] = (host, port, job.get("honor_labels", False))
    argv = service_argv(services["server"], ["allocator", "serve"])
    server = server_config(parse_cli(argv)[1], services["server"]["environment"])
    assert jobs["allocator-server"][:2] == ("server", str(server.metrics_port))
    assert jobs["pushgateway"][2] is True, "pushed job labels must survive the scrape"

    # Every job an alert rule selects is scraped here, or is a batch job's pushed label.
    from allocator.trainer.jobs.retrain.config import RetrainConfig
    from allocator.trainer.jobs.walk_forward.config import WalkForwardConfig

    pushed = {
        RetrainConfig.model_fields["job_name"].default,
        WalkForwardConfig.model_fields["job_name"].default,
    }
    alerts = (ROOT / "monitoring/alerts.yml").read_text()
    for job in set(re.findall(r'job="([^"]+)"', alerts)):
        assert job in jobs or job in pushed, f"alerts select job={job!r}, which nothing provides"
    # The servers are selected by the `service` label Kubernetes discovery sets: compose sets it.
    labelled = {
        static.get("labels", {}).get("service")
        for job in config["scrape_configs"]
        for static in job["static_configs"]
    }
    for name in set(re.findall(r'service="([^"]+)"', alerts)):
        assert name in labelled, f"alerts select service={name!r}, which no scrape job labels"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_the_prometheus_config():
    result = subprocess.run(
        ["promtool", "check", "config", str(DEPLOY / "prometheus/prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_provisioning_matches_the_mounts_and_dashboards(compose):
    grafana = compose["services"]["grafana"]
    mounts = dict(bind_mounts(grafana))
    provisioning = DEPLOY / "grafana/provisioning"
    assert host_path(next(s for s in mounts if s.endswith("provisioning"))) == provisioning
    providers = yaml.safe_load((provisioning / "dashboards/dashboards.yaml").read_text())
    (provider,) = providers["providers"]
    dashboards_source = next(s for s, t in mounts.items() if t == provider["options"]["path"])
    dashboards_dir = host_path(dashboards_source)
    assert dashboards_dir == ROOT / "monitoring/dashboards"

    datasources = yaml.safe_load((provisioning / "datasources/datasources.yaml").read_text())
    uids = [d["uid"] for d in datasources["datasources"]]
    assert len(uids) == len(set(uids))
    hosts = {d["url"].split("//")[-1].split(":")[0] for d in datasources["datasources"]}
    assert hosts <= set(compose["services"])
    # What the dashboards ask for exists: datasource variables by plugin type, fixed uids by uid.
    types = {d["type"] for d in datasources["datasources"]}
    for path in sorted(dashboards_dir.glob("*.json")):
        dashboard = json.loads(path.read_text())
        for variable in dashboard.get("templating", {}).get("list", []):
            if variable.get("type") == "datasource":
                assert variable["query"] in types, f"{path.name}: no {variable['query']} source"
        for ref in datasource_refs(dashboard):
            uid = ref.get("uid", "") if isinstance(ref, dict) else ref
            if uid and not uid.startswith("$") and uid != "-- Grafana --":  # built-in
                assert uid in uids, f"{path.name}: datasource uid {uid!r} is not provisioned"


def datasource_refs(node: Any) -> Iterator[Any]:
    if isinstance(node, dict):
        if "datasource" in node:
            yield node["datasource"]
        for value in node.values():
            yield from datasource_refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from datasource_refs(value)


def test_compose_trade_job_runs_a_cycle_against_the_server(compose):
    services = compose["services"]
    trade = services["trade"]
    assert trade["profiles"] == ["jobs"]
    command, params = parse_cli(service_argv(trade, []))
    assert command == "trade.cycle"
    assert params["date_"] == "latest"
    assert params["server"].split(":")[0] in services
    assert params["pushgateway_url"] == "http://pushgateway:9091"
    assert trade["image"] == services["server"]["image"]  # the serving image: no torch
    assert trade["environment"]["DATABASE_URL"] == services["server"]["environment"]["DATABASE_URL"]
