"""Which version of a model is production: ``REGISTRY/NAME/production.json``, written
atomically by a promotion; without a usable pointer, the newest version answers."""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from allocator.artifacts.files import atomic_write_text
from allocator.artifacts.manifest import MANIFEST_FILE
from allocator.registry.errors import ModelNotFoundError
from allocator.registry.naming import version_key
from allocator.registry.versions import versions

log = logging.getLogger("allocator.registry")

PRODUCTION_FILE = "production.json"


def read_production_pointer(registry: str | Path, name: str) -> dict[str, Any] | None:
    """``{"version": ..., ...}``, or None if unset. An unreadable pointer is logged and counts
    as unset: serving the newest version beats serving nothing."""
    path = Path(registry) / name / PRODUCTION_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.error("%s: unreadable production pointer (%s); using the newest version", path, exc)
        return None
    if not isinstance(data, dict) or not isinstance(data.get("version"), str):
        log.error("%s: production pointer has no version string; using the newest", path)
        return None
    return data


def write_production_pointer(
    registry: str | Path, name: str, version: str, **details: Any
) -> dict[str, Any]:
    """Point ``name``'s production at ``version``, atomically; returns the pointer written."""
    directory = Path(registry) / name
    if not (directory / version / MANIFEST_FILE).is_file():
        raise ModelNotFoundError(f"{directory / version}: no exported version to promote")
    pointer = {
        "version": version,
        "promoted_at": dt.datetime.now(dt.UTC).isoformat(),
        **details,
    }
    atomic_write_text(directory / PRODUCTION_FILE, json.dumps(pointer, indent=2, default=str))
    return pointer


def choose_production(pointed: str | None, available: Iterable[str]) -> tuple[str | None, str]:
    """The version that answers (``pointed`` if available, else the newest, else None), and why."""
    found = list(available)
    if pointed is not None and pointed in found:
        return pointed, "production pointer"
    if not found:
        return None, "no version in the registry"
    newest = max(found, key=version_key)
    if pointed is not None:
        return newest, f"newest version (the pointer names {pointed}, not exported)"
    return newest, "newest version (no production pointer)"


def production_version(registry: Path, name: str) -> tuple[str | None, str]:
    """The version a server answers with now for ``name``, and how it was chosen."""
    pointer = read_production_pointer(registry, name)
    pointed = pointer["version"] if pointer is not None else None
    return choose_production(pointed, versions(registry / name))
