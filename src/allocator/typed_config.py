"""Typed configuration files: strict models, YAML with ``--set`` overrides, errors by key.

Every file a user writes is read the same way, so a typo is refused the same way everywhere:
unknown keys are errors, and a bad value is named by the dotted key the user wrote.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the file and the key."""


class StrictModel(BaseModel):
    """Base of every user-written setting: unknown keys refused, values frozen after checks."""

    model_config = ConfigDict(extra="forbid", frozen=True)


Model = TypeVar("Model", bound=BaseModel)


def one_of(what: str, value: str, allowed: Collection[str]) -> str:
    """``value``, refused with the allowed names when a caller passes a name outside a fixed set."""
    if value not in allowed:
        raise ValueError(f"{what} {value!r} is not one of {', '.join(allowed)}")
    return value


# Tags pydantic inserts into an error's location for plain unions (``float | LinearSchedule``).
_TYPE_TAGS = frozenset({"float", "int", "str", "bool", "list", "dict", "none"})


def key_path(loc: Sequence[Any], tags: Collection[str] = ()) -> str:
    """The dotted key as the user wrote it, from a pydantic error location: without validator
    tags, builtin union member tags, and ``tags`` (union model names, discriminator values)."""
    kept = (str(p) for p in loc)
    return ".".join(
        p for p in kept if not p.startswith("function-") and p not in _TYPE_TAGS and p not in tags
    )


def validate(
    model: type[Model],
    tree: Any,
    source: str,
    what: str = "configuration",
    tags: Collection[str] = (),
) -> Model:
    """``model.model_validate(tree)``, or a ``ConfigError`` naming the file and each bad key."""
    try:
        return model.model_validate(tree)
    except ValidationError as exc:
        lines = [f"  {key_path(e['loc'], tags) or '(top level)'}: {e['msg']}" for e in exc.errors()]
        raise ConfigError("\n".join([f"{source}: invalid {what}", *lines])) from exc


def read_yaml(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """A YAML mapping of settings, or a ``ConfigError`` naming the file and the problem."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: {what} not found")
    try:
        loaded = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{p}: top level must be a mapping of settings")
    return loaded or {}


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A config tree by dotted key, as a user names a key in ``--set``: ``{"a": {"b": 1}}`` as
    ``{"a.b": 1}``; lists and empty mappings are values."""
    if not isinstance(tree, dict) or (prefix and not tree):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def apply_overrides(
    tree: dict[str, Any], overrides: Sequence[str], source: str = "(defaults)"
) -> dict[str, Any]:
    """Apply ``key.sub=value`` strings (values parsed as YAML) to a raw config tree."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{source}: --set expects key=value, got {item!r}")
        value = yaml.safe_load(raw)
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{source}: --set {key}: {part} is not a section")
        node[leaf] = value
    return tree


def load_tree(
    path: str | Path | None, overrides: Sequence[str] | None, what: str = "config file"
) -> tuple[dict[str, Any], str]:
    """The settings tree of ``path`` (``{}`` for None) with overrides applied, and its source."""
    source = str(path) if path is not None else "(defaults)"
    tree = read_yaml(path, what) if path is not None else {}
    return apply_overrides(tree, list(overrides or []), source), source


ENV_PREFIX = "ALLOCATOR_"
"""``ALLOCATOR_<KEY>`` sets a job's top-level key; ``__`` separates nested keys, as in
pydantic-settings (``ALLOCATOR_GATES__MAX_TURNOVER`` is ``--set gates.max_turnover=...``)."""


def env_overrides(
    model: type[BaseModel], environ: Mapping[str, str] | None = None
) -> list[tuple[str, str]]:
    """``(VARIABLE, "key.sub=value")`` for each ``ALLOCATOR_*`` variable naming a field of
    ``model``, applied like ``--set`` but below it; others are left alone, as one environment
    serves several commands (``ALLOCATOR_PORT`` is the server's, not a job's)."""
    environ = os.environ if environ is None else environ
    found = []
    for name, value in sorted(environ.items()):
        if not name.upper().startswith(ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX) :].lower().replace("__", ".")
        if key.split(".")[0] in model.model_fields:
            found.append((name, f"{key}={value}"))
    return found
