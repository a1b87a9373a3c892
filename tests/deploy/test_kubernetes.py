"""Kubernetes manifests against the API schemas (kubernetes-validate, strict: unknown fields
fail), for the oldest and newest Kubernetes we support; the commands through the real CLI and
config loaders; the TLS component applied and validated again; ``kubectl kustomize`` builds
when kubectl is installed.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from allocator.serving.server import SERVICE_NAME
from tests.deploy.helpers import (
    K8S,
    OLDEST_KUBERNETES,
    ROOT,
    apply_json_patch,
    container_argv,
    container_env,
    copies,
    k8s_files,
    k8s_resources,
    kustomize,
    parse_cli,
    pod_spec,
    resource,
    server_config,
    validate_k8s,
)


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
    assert not any("$(" in arg for arg in container_argv(container) + container.get("args", []))
    config = server_config(params, container_env(container))
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
    assert env["ALLOCATOR_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "DATABASE_URL"
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
    for name, value in container_env(container).items():
        monkeypatch.setenv(name, value)
    config = load_retrain_config(tmp_path / config_path.name, list(params["overrides"]))
    # Its prices come from the trade database the Secret names, as do its decisions.
    assert config.trainer.data.dataset == "database"
    assert config.database_url is None
    env = {e["name"]: e for e in container["env"]}
    assert env["ALLOCATOR_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == (
        "allocator-database"
    )
    # It is the shipped configs/retrain.yaml (the default recipe) on that data.
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
        == resource("ConfigMap", "allocator-config")["data"]["ALLOCATOR_PUSHGATEWAY_URL"]
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
    config = server_config(parse_cli(container_argv(container))[1], container_env(container))
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
    for components in ((), (K8S / "components/tls",)):
        objects = kustomize(K8S, *components, tmp_path=tmp_path / str(len(components)))
        for obj in objects:
            assert obj["metadata"].get("namespace", "allocator") == "allocator"
            validate_k8s(obj, OLDEST_KUBERNETES)
        assert len(objects) == len(k8s_resources())
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert any(a.startswith("--tls-cert=") for a in pod_spec(deployment)["containers"][0]["args"])


def test_trade_cronjob_runs_a_cycle_on_the_latest_bar_against_the_server():
    cronjob = resource("CronJob", "allocator-trade")
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    spec = pod_spec(cronjob)
    (container,) = spec["containers"]
    command, params = parse_cli(container_argv(container))
    assert command == "trade.cycle"
    assert params["date_"] == "latest"
    config = resource("ConfigMap", "allocator-config")["data"]
    assert params["account_name"] == config["TRADE_ACCOUNT"]
    assert params["pushgateway_url"] == config["ALLOCATOR_PUSHGATEWAY_URL"]
    host, _, port = params["server"].partition(":")
    service = resource("Service", "allocator-server")
    assert host == service["metadata"]["name"]
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}
    # The serving image (no torch), the trade database from the Secret.
    server = pod_spec(resource("Deployment", "allocator-server"))["containers"][0]
    assert container["image"] == server["image"]
    env = {e["name"]: e for e in container["env"]}
    assert env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "allocator-database"
    for key in ("ALPACA_API_KEY", "ALPACA_SECRET_KEY"):  # only an Alpaca account needs them
        assert env[key]["valueFrom"]["secretKeyRef"]["optional"] is True
    # The server wants its bearer token: the same Secret, mounted where --token-file reads.
    token = Path(params["token_file"])
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(token.parent))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    served = pod_spec(resource("Deployment", "allocator-server"))["volumes"]
    assert volume["secret"]["secretName"] in {
        v["secret"]["secretName"] for v in served if "secret" in v
    }
