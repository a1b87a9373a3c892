"""Which registry directories are versions: non-hidden ones holding ``manifest.json`` (written
last, so a directory without one is an export in progress)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from allocator.artifacts.manifest import MANIFEST_FILE
from allocator.registry.errors import ModelNotFoundError
from allocator.registry.naming import is_hidden, is_valid_name, version_key

CANDIDATES_DIR = ".candidates"
"""Where candidates wait, inside the registry (``REGISTRY/.candidates/NAME/VERSION``): hidden
from servers, so a rejected model is never served, not even as the newest version."""


def check_component(value: str, what: str, registry: Path) -> None:
    """Names come from requests: one plain path component, never ``..`` or a separator."""
    if not is_valid_name(value):
        raise ModelNotFoundError(f"{registry}: invalid {what} {value!r}")


def versions(model_dir: Path) -> list[str]:
    """The versions in ``REGISTRY/NAME``, oldest first."""
    manifests = model_dir.glob(f"*/{MANIFEST_FILE}")  # none when the directory does not exist
    found = [m.parent.name for m in manifests if not is_hidden(m.parent.name) and m.is_file()]
    return sorted(found, key=version_key)


def list_models(registry: str | Path) -> list[tuple[str, str]]:
    """Every ``(name, version)`` with a manifest, by name then version (numeric order)."""
    r = Path(registry)
    if not r.is_dir():
        raise ModelNotFoundError(f"{r}: no such registry directory")
    names = sorted(p.name for p in r.iterdir() if p.is_dir() and not is_hidden(p.name))
    return [(name, v) for name in names for v in versions(r / name)]


def latest_version(registry: str | Path, name: str) -> str:
    """The highest version of ``name``, numeric versions compared as numbers."""
    r = Path(registry)
    check_component(name, "model name", r)
    found = versions(r / name)
    if not found:
        known = sorted({n for n, _ in list_models(r)}) if r.is_dir() else []
        raise ModelNotFoundError(
            f"{r / name}: no model named {name!r} in registry {r} "
            f"(available: {', '.join(known) or 'none'})"
        )
    return found[-1]


def resolve(registry: str | Path, name: str, version: str | None = None) -> Path:
    """The directory of ``name`` at ``version`` (latest when None), or ModelNotFoundError."""
    r = Path(registry)
    check_component(name, "model name", r)
    if version is None:
        version = latest_version(r, name)
    check_component(version, "version", r)
    d = r / name / version
    if not (d / MANIFEST_FILE).is_file():
        found = versions(r / name)
        if not found:
            latest_version(r, name)  # raises naming the missing model
        raise ModelNotFoundError(
            f"{d}: model {name!r} has no version {version!r} (available: {', '.join(found)})"
        )
    return d


def next_version(model_dir: Path) -> str:
    """One more than the largest integer-named directory ("1" when none); one without a
    manifest counts too: an export in progress has taken its number."""
    numbers = [int(p.name) for p in model_dir.glob("*") if p.name.isdecimal() and p.is_dir()]
    return str(max(numbers, default=0) + 1)


def dated_version(registry: Path, name: str, day: dt.date) -> str:
    """``YYYYMMDD`` of ``day``, or ``YYYYMMDD.N`` if an entry of ``NAME`` or a candidate has it."""
    taken = {p.name for p in (registry / name).glob("*")}  # its versions among them
    taken |= set(versions(registry / CANDIDATES_DIR / name))
    base = f"{day:%Y%m%d}"
    version, n = base, 0
    while version in taken:
        n += 1
        version = f"{base}.{n}"
    return version
