"""What the deployment tests share: paths, parsers of the CLI and the Dockerfiles, the
Kubernetes schema validation and ``kubectl kustomize``."""

from __future__ import annotations

import copy
import fnmatch
import importlib.util
import os
import re
import shlex
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

import click
import dockerfile
import kubernetes_validate
import yaml

from allocator.cli import main as cli_main
from allocator.serving.server import ServerConfig

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE_FILE = DEPLOY / "compose.yaml"
OLDEST_KUBERNETES = "1.29"  # native gRPC probes and CronJob timeZone are GA from 1.27


# --- parsing and validation ----------------------------------------------------------------


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


def server_config(params: dict[str, Any], env: dict[str, str] | None = None) -> ServerConfig:
    """What ``allocator serve`` builds from its parsed flags and ``env`` (the container's
    environment, in place of this process's ALLOCATOR_* variables), as cli.serve does; an
    option or variable value ServerConfig refuses fails."""
    from allocator.cli.serve import NAMED_FLAGS, server_flags
    from allocator.serving.config import load_server_config

    options = dict(params)
    config_file = options.pop("config_file", None)
    ours = {k: v for k, v in os.environ.items() if not k.upper().startswith("ALLOCATOR_")}
    with mock.patch.dict(os.environ, {**ours, **(env or {})}, clear=True):
        return load_server_config(server_flags(options), config_file, flag_names=NAMED_FLAGS)


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


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """A container's environment from env literals and ConfigMaps (Secrets are not known)."""
    values: dict[str, str] = {}
    for source in container.get("envFrom", []):
        values.update(resource("ConfigMap", source["configMapRef"]["name"])["data"])
    for env in container.get("env", []):
        if "value" in env:
            values[env["name"]] = env["value"]
        elif "configMapKeyRef" in env.get("valueFrom", {}):
            ref = env["valueFrom"]["configMapKeyRef"]
            values[env["name"]] = resource("ConfigMap", ref["name"])["data"][ref["key"]]
    return values


def expand_kubernetes_vars(argv: list[str], container: dict[str, Any]) -> list[str]:
    """kubelet's ``$(NAME)`` expansion in command/args, from env and envFrom ConfigMaps.

    Secret values are not known here: a ``$(NAME)`` that would need one fails the test, as
    would one naming no variable at all (kubelet would pass it on literally).
    """
    values = container_env(container)

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


# --- Dockerfiles -------------------------------------------------------------------------

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


def kustomize(target: Path, *components: Path, tmp_path: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize`` renders for ``target`` with ``components`` applied
    (through an overlay written under ``tmp_path``; none: ``target`` itself)."""
    extra: list[str] = []
    if components:
        overlay = tmp_path / "overlay"
        overlay.mkdir(parents=True)
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(target, overlay)],
            "components": [os.path.relpath(c, overlay) for c in components],
        }
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        target, extra = overlay, ["--load-restrictor", "LoadRestrictionsNone"]
    out = subprocess.run(
        ["kubectl", "kustomize", str(target), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [o for o in yaml.safe_load_all(out) if o]
