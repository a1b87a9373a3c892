"""Install groups: a client install is gRPC only, a serving install never pulls torch, training
pins torch 2.13.0, and requirements.lock pins every dependency of every extra within pyproject."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def test_training_pins_torch_and_serving_does_not_list_it():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert "torch==2.13.0" in extras["train"]
    for group in ("serve",):
        assert not any(
            dep.lower().startswith(("torch", "stable-baselines3")) for dep in extras[group]
        )
    assert not any(
        dep.split(">")[0].split("=")[0] == "onnxruntime" for deps in extras.values() for dep in deps
    ), "use onnxruntime-gpu only"


def declared(extras: dict[str, list[str]], group: str) -> set[str]:
    """The distributions an extra lists, its ``allocator[...]`` references followed."""
    names: set[str] = set()
    for dep in extras[group]:
        requirement = Requirement(dep)
        if canonicalize_name(requirement.name) == "allocator":
            for inner in requirement.extras:
                names |= declared(extras, inner)
        else:
            names.add(canonicalize_name(requirement.name))
    return names


def test_mlflow_comes_only_with_its_own_extra_and_dev():
    """Serving never imports MLflow and a training install does not pull it unless asked."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert "mlflow-skinny" in declared(extras, "mlflow")
    assert "mlflow-skinny" in declared(extras, "dev"), "the tracking tests run in CI"
    for group in ("client", "serve", "train"):
        assert not {n for n in declared(extras, group) if n.startswith("mlflow")}, group


def resolved(extra: str, tmp_path: Path) -> set[str]:
    """What pip's resolver, asked for ``allocator[extra]`` in an empty environment, installs."""
    report = tmp_path / f"report-{extra}.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            f"{ROOT}[{extra}]",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}


def test_serving_install_resolves_without_torch(tmp_path):
    """pip's resolver, asked for `allocator[serve]`, installs neither torch nor SB3."""
    names = resolved("serve", tmp_path)
    assert "onnxruntime-gpu" in names
    assert not names & {"torch", "stable-baselines3", "gymnasium", "nvidia-cudnn-cu12"}, names


def test_client_install_is_grpc_protobuf_and_numpy(tmp_path):
    """`allocator[client]` (a trading service that only asks a server): no onnxruntime, no SQL."""
    names = resolved("client", tmp_path)
    assert {"grpcio", "protobuf", "numpy", "allocator"} <= names
    server_side = {"onnxruntime", "onnxruntime-gpu", "sqlalchemy", "alembic", "psycopg", "redis"}
    assert not names & (server_side | {"torch", "prometheus-client"}), names


def lock_pins() -> dict[str, Version]:
    """requirements.lock as name -> pinned version (every line must be an exact pin)."""
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        (spec,) = requirement.specifier
        assert spec.operator == "==", f"requirements.lock: {line} is not an exact pin"
        pins[canonicalize_name(requirement.name)] = Version(spec.version)
    return pins


def test_lock_pins_every_dependency_within_pyproject():
    """A dependency added to pyproject without `make lock`, or a floor raised past its pin."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = lock_pins()
    groups = {"base": project["dependencies"], **project["optional-dependencies"]}
    for group, deps in groups.items():
        for dep in deps:
            requirement = Requirement(dep)
            name = canonicalize_name(requirement.name)
            if name == "allocator":
                continue
            assert name in pins, f"{name} ({group}) is not in requirements.lock: run `make lock`"
            assert requirement.specifier.contains(pins[name], prereleases=True), (
                f"requirements.lock pins {name}=={pins[name]}, outside {dep} ({group})"
            )
    assert str(pins["torch"]) == "2.13.0+cpu", "the lock's torch must be the 2.13.0 CPU build"
    assert "onnxruntime" not in pins, "onnxruntime-gpu only"
    assert "allocator" not in pins
