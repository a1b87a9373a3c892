"""Deployment files: checked by real parsers and validators, and against the real CLI.

- Kubernetes manifests against the API schemas (kubernetes-validate, strict: unknown fields
  fail), for the oldest and newest Kubernetes we support; the TLS component applied to the
  Deployment and validated again; ``kubectl kustomize`` builds when kubectl is installed.
- Every command in the manifests and the compose file goes through click's parser of the
  ``allocator`` CLI, and the server's through ``ServerConfig``; the jobs' ``--set`` overrides
  through the real retrain / walk-forward config loaders.
- The compose file structurally: builds, mounts, dependencies, ports, the Prometheus and
  Grafana wiring; ``promtool check config`` when promtool is installed.
- Dockerfiles parsed by BuildKit's parser (the ``dockerfile`` package): the serving image
  installs the ``serve`` extra and no torch, COPY sources exist and pass .dockerignore.
- The health check script against a real gRPC health server, plaintext, TLS and mTLS.
- The configuration reference in docs/operations.md is what the script renders now.
"""

from __future__ import annotations

import copy
import fnmatch
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import click
import dockerfile
import grpc
import kubernetes_validate
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from pydantic import TypeAdapter

from allocator.cli import main as cli_main
from allocator.serving.server import SERVICE_NAME, ServerConfig

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE_FILE = DEPLOY / "compose.yaml"
OLDEST_KUBERNETES = "1.29"  # native gRPC probes and CronJob timeZone are GA from 1.27


# --- helpers -------------------------------------------------------------------------------


def load_module(path: Path) -> ModuleType:
    """A script outside the package (scripts/, deploy/docker/) imported by path."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_cli(argv: list[str]) -> tuple[str, dict[str, Any]]:
    """Run ``argv`` through click's parser of the real CLI, without invoking anything.

    Returns the subcommand's dotted name (``db.upgrade``) and its parsed parameters; an
    unknown command or option, or a bad value, raises click's UsageError/BadParameter.
    """
    assert argv[0] == "allocator", argv
    command: click.Command = cli_main
    args = list(argv[1:])
    names: list[str] = []
    ctx = click.Context(cli_main)
    while isinstance(command, click.Group):
        if command.invoke_without_command and (not args or args[0].startswith("-")):
            break  # a group that runs itself (``walk-forward --config ...``)
        name, *args = args
        sub = command.get_command(ctx, name)
        assert sub is not None, f"allocator has no command {' '.join([*names, name])!r}"
        names.append(name)
        command = sub
    with command.make_context(" ".join(["allocator", *names]), args) as sub_ctx:
        return ".".join(names), dict(sub_ctx.params)


REFERENCE = load_module(ROOT / "scripts/config_reference.py")


def server_config(params: dict[str, Any]) -> ServerConfig:
    """What ``allocator serve`` builds from its parsed flags (negated flags inverted, as
    cli.serve does); an option that is not a ServerConfig field fails (extra="forbid")."""
    options = dict(params)
    for field, flag in REFERENCE.negated_flags().items():
        options[field] = not options.pop(flag)
    return ServerConfig(**{k: v for k, v in options.items() if v is not None})


def k8s_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def k8s_resources() -> list[tuple[Path, dict[str, Any]]]:
    return [
        (path, doc)
        for path in k8s_files()
        for doc in yaml.safe_load_all(path.read_text())
        if doc  # an empty document between separators
    ]


def resource(kind: str, name: str) -> dict[str, Any]:
    found = [r for _, r in k8s_resources() if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return obj["spec"]["template"]["spec"]


def expand_kubernetes_vars(argv: list[str], container: dict[str, Any]) -> list[str]:
    """kubelet's ``$(NAME)`` expansion in command/args, from env and envFrom ConfigMaps.

    Secret values are not known here: a ``$(NAME)`` that would need one fails the test, as
    would one naming no variable at all (kubelet would pass it on literally).
    """
    values: dict[str, str] = {}
    for source in container.get("envFrom", []):
        values.update(resource("ConfigMap", source["configMapRef"]["name"])["data"])
    for env in container.get("env", []):
        if "value" in env:
            values[env["name"]] = env["value"]
        elif "configMapKeyRef" in env.get("valueFrom", {}):
            ref = env["valueFrom"]["configMapKeyRef"]
            values[env["name"]] = resource("ConfigMap", ref["name"])["data"][ref["key"]]

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in values, f"$({name}) is not a ConfigMap or literal variable"
        return values[name]

    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", substitute, arg) for arg in argv]


def container_argv(container: dict[str, Any]) -> list[str]:
    return expand_kubernetes_vars(
        [*container.get("command", []), *container.get("args", [])], container
    )


def apply_json_patch(document: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 ``add``/``replace`` (what components/tls uses) on a deep copy."""
    doc = copy.deepcopy(document)
    for op in operations:
        *parents, last = [
            p.replace("~1", "/").replace("~0", "~") for p in op["path"][1:].split("/")
        ]
        target: Any = doc
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if op["op"] == "add" and isinstance(target, list):
            target.insert(len(target) if last == "-" else int(last), op["value"])
        elif op["op"] == "add" or (op["op"] == "replace" and last in target):
            target[last] = op["value"]
        else:
            raise AssertionError(f"unsupported or failing operation {op}")
    return doc


def validate_k8s(obj: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(obj, version, strict=True)


# --- Kubernetes ----------------------------------------------------------------------------


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == [p.name for p in k8s_files()]
    images = {i["name"] for i in kustomization["images"]}
    used = {
        c["image"]
        for _, r in k8s_resources()
        if r["kind"] in {"Deployment", "Job", "CronJob"}
        for c in pod_spec(r)["containers"]
    }
    assert used <= images, "every image is one `kustomize edit set image` can point elsewhere"


@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, kubernetes_validate.latest_version()])
def test_manifests_validate_against_the_kubernetes_schemas(version):
    kinds = set()
    for path, obj in k8s_resources():
        try:
            validate_k8s(obj, version)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(map(str, exc.path))
            pytest.fail(f"{path.name}: {obj['kind']}/{obj['metadata']['name']}: {where}: {exc}")
        kinds.add(obj["kind"])
    assert {
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "ConfigMap",
        "CronJob",
        "Job",
        "PersistentVolumeClaim",
    } <= kinds


def test_the_validator_catches_what_it_should():
    """The passing test above means something: strict validation refuses these."""
    deployment = resource("Deployment", "allocator-server")
    broken = copy.deepcopy(deployment)
    pod_spec(broken)["containers"][0]["readinessProbe"]["grpc"]["port"] = "grpc"  # must be int
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_k8s(broken, OLDEST_KUBERNETES)
    unknown = copy.deepcopy(deployment)
    pod_spec(unknown)["containers"][0]["resource"] = {}  # a typo of `resources`
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_k8s(unknown, OLDEST_KUBERNETES)


def test_server_deployment_probes_resources_and_wiring():
    deployment = resource("Deployment", "allocator-server")
    spec = pod_spec(deployment)
    (container,) = spec["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        grpc_probe = container[probe]["grpc"]
        assert grpc_probe == {"port": ports["grpc"], "service": SERVICE_NAME}, probe
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= container["resources"][kind].keys()

    # The command is `allocator serve` with flags it has, values ServerConfig accepts.
    command, params = parse_cli(container_argv(container))
    assert command == "serve"
    config = server_config(params)
    assert config.port == ports["grpc"]
    assert config.metrics_port == ports["metrics"]
    assert config.host == "0.0.0.0"  # probes, Service and Prometheus reach the pod's IP
    assert config.redis_url is not None
    assert config.redis_url.startswith("redis://")
    assert config.record
    assert config.auth_token_file is not None

    # Files the flags name lie on the volumes mounted for them.
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert {m["name"] for m in mounts.values()} <= volumes.keys()
    assert mounts[str(config.registry)]["readOnly"] is True
    assert volumes[mounts[str(config.registry)]["name"]]["persistentVolumeClaim"]
    assert str(config.spool_dir) in mounts
    token_mount = mounts[str(config.auth_token_file.parent)]
    assert "secret" in volumes[token_mount["name"]]

    env = {e["name"]: e for e in container["env"]}
    assert env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "DATABASE_URL"
    # Graceful stop fits: preStop pause + drain + in-flight grace + 60 s recorder flush.
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    budget = pause + config.drain_seconds + config.grace_seconds + 60
    assert spec["terminationGracePeriodSeconds"] >= budget
    assert spec["securityContext"]["runAsNonRoot"] is True


def test_services_hpa_and_pdb_select_the_server_pods():
    deployment = resource("Deployment", "allocator-server")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    port_names = {p["name"] for p in pod_spec(deployment)["containers"][0]["ports"]}
    for name in ("allocator-server", "allocator-server-headless"):
        service = resource("Service", name)
        assert service["spec"]["selector"].items() <= labels.items()
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names
    annotations = resource("Service", "allocator-server")["metadata"]["annotations"]
    metrics_port = next(
        p["containerPort"]
        for p in pod_spec(deployment)["containers"][0]["ports"]
        if p["name"] == "metrics"
    )
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(metrics_port)
    hpa = resource("HorizontalPodAutoscaler", "allocator-server")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "allocator-server")
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    assert hpa["spec"]["minReplicas"] >= 2  # a rolling restart never leaves zero ready
    pdb = resource("PodDisruptionBudget", "allocator-server")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_claims_and_secrets_are_defined_or_documented():
    claims = {
        r["metadata"]["name"] for _, r in k8s_resources() if r["kind"] == "PersistentVolumeClaim"
    }
    readme = (K8S / "README.md").read_text()
    for _, obj in k8s_resources():
        if obj["kind"] not in {"Deployment", "Job", "CronJob"}:
            continue
        for volume in pod_spec(obj).get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims
            if "secret" in volume:
                assert volume["secret"]["secretName"] in readme
        for container in pod_spec(obj)["containers"]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert f"secret generic {ref['name']}" in readme, ref
                    assert f"{ref['key']}=" in readme, ref


def test_retrain_cronjob_runs_a_valid_retrain(monkeypatch, tmp_path):
    from allocator.trainer.jobs.retrain.config import load_retrain_config

    cronjob = resource("CronJob", "allocator-retrain")
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    assert len(cronjob["spec"]["schedule"].split()) == 5
    spec = pod_spec(cronjob)
    (container,) = spec["containers"]
    command, params = parse_cli(container_argv(container))
    assert command == "retrain"
    # The config comes from a ConfigMap mounted read-only: its files, laid out as mounted.
    config_path = Path(params["config_path"])
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    assert mount.get("readOnly") is True
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    for name, text in resource("ConfigMap", volume["configMap"]["name"])["data"].items():
        (tmp_path / name).write_text(text)
    # The trainer image's working directory is the checkout's root (configs/ relative to it).
    monkeypatch.chdir(ROOT)
    config = load_retrain_config(tmp_path / config_path.name, list(params["overrides"]))
    # Its prices come from the trade database the Secret names, as do its decisions.
    assert config.trainer.data.dataset == "database"
    assert config.database_url is None
    env = {e["name"]: e for e in container["env"]}
    assert env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "allocator-database"
    # It is the shipped configs/retrain.yaml (trainer configs/td3.yaml) on that data.
    shipped = load_retrain_config(ROOT / "configs/retrain.yaml")
    same = {"trainer", "registry", "pushgateway_url"}
    assert config.model_dump(exclude=same) == shipped.model_dump(exclude=same)
    assert config.trainer.model_dump(exclude={"data"}) == shipped.trainer.model_dump(
        exclude={"data"}
    )
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert str(config.registry) in mounts
    assert (
        config.pushgateway_url
        == resource("ConfigMap", "allocator-config")["data"]["PUSHGATEWAY_URL"]
    )
    # Writes the registry the servers read: the same claim.
    server = pod_spec(resource("Deployment", "allocator-server"))
    claim = {
        v["persistentVolumeClaim"]["claimName"]
        for v in spec["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert claim == {
        v["persistentVolumeClaim"]["claimName"]
        for v in server["volumes"]
        if "persistentVolumeClaim" in v
    }


def test_migrations_job_runs_db_upgrade():
    job = resource("Job", "allocator-migrations")
    (container,) = pod_spec(job)["containers"]
    command, params = parse_cli(container_argv(container))
    assert (command, params["revision"]) == ("db.upgrade", "head")
    assert (
        container["image"]
        == pod_spec(resource("Deployment", "allocator-server"))["containers"][0]["image"]
    )


def tls_patch() -> list[dict[str, Any]]:
    return yaml.safe_load((K8S / "components/tls/deployment-patch.yaml").read_text())


def test_tls_component_gives_a_valid_tls_server_with_exec_probes():
    component = yaml.safe_load((K8S / "components/tls/kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    (patch,) = component["patches"]
    assert patch["target"]["name"] == "allocator-server"
    patched = apply_json_patch(resource("Deployment", "allocator-server"), tls_patch())
    for version in (OLDEST_KUBERNETES, kubernetes_validate.latest_version()):
        validate_k8s(patched, version)
    (container,) = pod_spec(patched)["containers"]
    config = server_config(parse_cli(container_argv(container))[1])
    assert config.tls_cert is not None
    assert config.tls_key is not None
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(patched)["volumes"]}
    assert volumes[mounts[str(config.tls_cert.parent)]]["secret"]["secretName"] == "allocator-tls"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert Path(env["ALLOCATOR_HEALTH_CA"]).parent == config.tls_cert.parent
    # The exec probes run the script where the serving image puts it.
    copied = {Path(c.value[-1]) / Path(c.value[0]).name for c in copies("serve.Dockerfile")}
    copied |= {Path(c.value[-1]) for c in copies("serve.Dockerfile")}
    workdir = Path("/app")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        script = Path(container[probe]["exec"]["command"][-1])
        assert script.relative_to(workdir) in copied, script


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) not installed")
def test_kustomize_builds_base_and_tls_overlay(tmp_path):
    """kubectl's own kustomize renders both; every rendered object validates."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(K8S, overlay)],
                "components": [os.path.relpath(K8S / "components/tls", overlay)],
            }
        )
    )
    for target, extra in ((K8S, []), (overlay, ["--load-restrictor", "LoadRestrictionsNone"])):
        out = subprocess.run(
            ["kubectl", "kustomize", str(target), *extra],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        objects = [o for o in yaml.safe_load_all(out) if o]
        for obj in objects:
            assert obj["metadata"].get("namespace", "allocator") == "allocator"
            validate_k8s(obj, OLDEST_KUBERNETES)
        assert len(objects) == len(k8s_resources())
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert any(a.startswith("--tls-cert=") for a in pod_spec(deployment)["containers"][0]["args"])


# --- compose -------------------------------------------------------------------------------


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
    config = server_config(params)
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
    server = server_config(parse_cli(service_argv(services["server"], ["allocator", "serve"]))[1])
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


# --- Dockerfiles ---------------------------------------------------------------------------

INSTRUCTIONS = {
    "ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK", "LABEL",
    "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR",
}  # fmt: skip


def instructions(name: str) -> tuple[dockerfile.Command, ...]:
    return dockerfile.parse_file(str(DEPLOY / "docker" / name))


def copies(name: str) -> list[dockerfile.Command]:
    return [c for c in instructions(name) if c.cmd == "COPY"]


def pip_installs(name: str) -> list[list[str]]:
    """The argument lists of every ``pip install`` in RUN instructions."""
    found = []
    for command in instructions(name):
        if command.cmd != "RUN":
            continue
        lexer = shlex.shlex(" ".join(command.value), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words: list[str] = []
        for token in [*lexer, ";"]:
            if token in {"&&", "||", ";", "|"}:
                if words[:2] == ["pip", "install"]:
                    found.append(words[2:])
                words = []
            else:
                words.append(token)
    return found


def dockerignore_allows(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents wins."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatch(c.split("/")[-1], pattern[3:]) for c in candidates)
        else:
            hit = any(fnmatch.fnmatch(c, pattern) for c in candidates)
        if hit:
            included = negate
    return included


@pytest.mark.parametrize("name", ["serve.Dockerfile", "train.Dockerfile"])
def test_dockerfiles_parse_copy_existing_files_and_drop_root(name):
    commands = instructions(name)
    assert {c.cmd for c in commands} <= INSTRUCTIONS
    base = next(c for c in commands if c.cmd == "FROM").value[0]
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    python = base.split(":")[1].split("-")[0]  # python:3.11-slim -> 3.11
    assert base.startswith("python:")
    assert f">={python}" in requires
    for command in commands:
        if command.cmd == "COPY":
            assert not any(f.startswith("--from") for f in command.flags)
            for source in command.value[:-1]:
                assert (ROOT / source).exists(), f"{name}: COPY {source}: no such file"
                assert dockerignore_allows(source), f"{name}: .dockerignore excludes {source}"
    user = [c for c in commands if c.cmd == "USER"][-1].value[0]
    assert user.split(":")[0] not in {"root", "0"}
    # The build context stays small: the virtualenv, runs and models never go in.
    for excluded in (".venv/bin/python", "runs/x", "models/x/1", ".git/HEAD", "allocator.db"):
        assert not dockerignore_allows(excluded), excluded


def test_serve_image_installs_the_serve_extra_and_never_torch():
    installs = pip_installs("serve.Dockerfile")
    assert installs == [["--constraint", "requirements.lock", ".[serve]"]]
    assert any("requirements.lock" in c.value for c in copies("serve.Dockerfile"))
    runs = " ".join(" ".join(c.value) for c in instructions("serve.Dockerfile") if c.cmd == "RUN")
    assert "! pip show torch" in runs, "the build fails if torch sneaks in"
    assert "torch" not in runs.replace("! pip show torch", "")
    commands = instructions("serve.Dockerfile")
    entrypoint = next(c for c in commands if c.cmd == "ENTRYPOINT")
    cmd = next(c for c in commands if c.cmd == "CMD")
    assert entrypoint.json
    assert list(entrypoint.value) == ["allocator", "serve"]
    command, params = parse_cli([*entrypoint.value, *cmd.value])
    assert command == "serve"
    assert server_config(params).host == "0.0.0.0"
    healthcheck = next(c for c in commands if c.cmd == "HEALTHCHECK")
    script = Path(healthcheck.value[-1])
    assert script.relative_to("/app") in {Path(c.value[-1]) for c in copies("serve.Dockerfile")}


def test_train_image_installs_the_pinned_cpu_torch_then_the_train_extra():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    pin = next(d for d in extras["train"] if d.startswith("torch=="))
    installs = pip_installs("train.Dockerfile")
    torch_install = next(i for i in installs if pin in i)
    assert torch_install[torch_install.index("--index-url") + 1] == (
        "https://download.pytorch.org/whl/cpu"
    )
    args = {
        c.value[0].split("=")[0]: c.value[0]
        for c in instructions("train.Dockerfile")
        if c.cmd == "ARG"
    }
    assert args["EXTRAS"] == "EXTRAS=train"
    locked = ["--constraint", "requirements.lock", ".[${EXTRAS}]"]
    assert locked in installs
    assert installs.index(torch_install) < installs.index(locked)


# --- health check script -------------------------------------------------------------------

HEALTHCHECK = DEPLOY / "docker/healthcheck.py"


@pytest.fixture(scope="module")
def healthcheck() -> ModuleType:
    return load_module(HEALTHCHECK)


def health_server(credentials: grpc.ServerCredentials | None = None):
    server = grpc.server(futures.ThreadPoolExecutor(2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    address = "127.0.0.1:0"
    port = (
        server.add_secure_port(address, credentials)
        if credentials
        else server.add_insecure_port(address)
    )
    server.start()
    return server, servicer, f"127.0.0.1:{port}"


def test_healthcheck_reports_the_servers_health(healthcheck):
    assert healthcheck.SERVICE == SERVICE_NAME
    server, servicer, target = health_server()
    try:
        servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        assert healthcheck.main(["--target", target]) == 0
        # As Docker runs it: a process, settings from the environment.
        run = subprocess.run(
            [sys.executable, str(HEALTHCHECK)],
            env={"ALLOCATOR_HEALTH_TARGET": target, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert "SERVING" in run.stdout
        assert healthcheck.main(["--target", target, "--service", "other.Service"]) == 1
        servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)  # draining
        assert healthcheck.main(["--target", target]) == 1
    finally:
        server.stop(None)
    assert healthcheck.main(["--target", target, "--timeout", "0.5"]) == 1  # nothing listens


def test_healthcheck_over_tls_and_mtls(healthcheck, tmp_path):
    from tests.serving.certs import have_openssl, make_pki

    if not have_openssl():
        pytest.skip("openssl not installed")
    pki = make_pki(tmp_path / "pki")
    tls = grpc.ssl_server_credentials([(pki.read("server.key"), pki.read("server.pem"))])
    server, servicer, target = health_server(tls)
    try:
        servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        ca = str(pki.path("ca.pem"))
        assert healthcheck.main(["--target", target, "--ca", ca]) == 0
        assert healthcheck.main(["--target", target, "--ca", ca, "--server-name", "localhost"]) == 0
        assert healthcheck.main(["--target", target, "--timeout", "1"]) == 1  # plaintext
        wrong_ca = str(pki.path("client-ca.pem"))
        assert healthcheck.main(["--target", target, "--ca", wrong_ca, "--timeout", "1"]) == 1
    finally:
        server.stop(None)

    mtls = grpc.ssl_server_credentials(
        [(pki.read("server.key"), pki.read("server.pem"))],
        root_certificates=pki.read("client-ca.pem"),
        require_client_auth=True,
    )
    server, servicer, target = health_server(mtls)
    try:
        servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        client = ["--cert", str(pki.path("client.pem")), "--key", str(pki.path("client.key"))]
        assert healthcheck.main(["--target", target, "--ca", ca, *client]) == 0
        assert healthcheck.main(["--target", target, "--ca", ca, "--timeout", "1"]) == 1
    finally:
        server.stop(None)


# --- configuration reference ---------------------------------------------------------------


def test_configuration_reference_is_current():
    document = (ROOT / "docs/operations.md").read_text()
    assert REFERENCE.splice(document, REFERENCE.render()) == document, (
        "docs/operations.md is stale: run python scripts/config_reference.py --write"
    )


def test_configuration_reference_covers_every_setting():
    from allocator.trainer.jobs.retrain.config import RetrainConfig
    from allocator.trainer.jobs.retrain.gates import GateSettings
    from allocator.trainer.jobs.walk_forward.config import WalkForwardConfig

    section = REFERENCE.render()
    for model in (ServerConfig, RetrainConfig, GateSettings, WalkForwardConfig):
        for name in model.model_fields:
            assert f"| `{name}` |" in section, f"{model.__name__}.{name}"
    # A setting the CLI renamed or negated is shown with the flag that sets it.
    assert "| `default_model` | `--model` |" in section
    assert "| `prefer_cuda` | `--cpu` (negated) |" in section


def test_serve_flags_are_config_fields_with_the_config_defaults():
    """The reference shows ServerConfig's defaults next to each flag: they must agree."""
    from allocator.cli.serve import serve

    fields = ServerConfig.model_fields
    negated = {flag: field for field, flag in REFERENCE.negated_flags().items()}
    for param in serve.params:
        assert isinstance(param, click.Option)
        if param.name in negated:
            assert fields[negated[param.name]].default is True  # the flag turns it off
            continue
        assert param.name in fields, f"--{param.name} sets no ServerConfig field"
        if not param.required and param.default is not None:
            # Compared as the model reads the flag ("spool" is Path("spool")).
            default = TypeAdapter(fields[param.name].annotation).validate_python(param.default)
            assert default == fields[param.name].default, f"--{param.name}"
