"""The versioned ``manifest.json`` that travels with every checkpoint and exported model.

It records everything needed to run a policy exactly as it was trained (feature spec,
normalization, action mapping, smoothing beta, costs) and to trust the files beside it (sha256).
Torch-free on purpose: the server reads it too. Older schema versions are upgraded by
``allocator checkpoint migrate``, never read silently.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from allocator.artifacts.files import atomic_write_text
from allocator.typed_config import StrictModel

SCHEMA_VERSION = 2
MANIFEST_FILE = "manifest.json"
ACTION_MAPPING = "affine_renormalize_v1"
"""``portfolio.action_to_weights``: preference (a + 1) / 2, masked, renormalized, else cash."""


class ManifestError(ValueError):
    """A manifest that is missing, unreadable, of another schema version, or does not match."""


class FeatureSpecInfo(StrictModel):
    """How observations are built: see ``portfolio.observation``."""

    max_assets: int = Field(ge=1)
    window: int = Field(ge=1)
    clip: float = Field(gt=0)
    features: list[str] = Field(default_factory=lambda: ["log_return"])


class NormalizationInfo(StrictModel):
    """Statistics of daily log returns over the training period."""

    mean: float
    std: float = Field(gt=0)


class DataInfo(StrictModel):
    """Where the training data came from and which periods were used."""

    dataset: str
    universe: list[str]
    train_start: str
    train_end: str
    validation_start: str | None = None
    validation_end: str | None = None


class MigrationRecord(StrictModel):
    """One step applied by ``allocator checkpoint migrate``."""

    from_version: int
    to_version: int
    at: str
    note: str = ""


class Manifest(StrictModel):
    """Schema version 2."""

    schema_version: int = SCHEMA_VERSION
    created: str = Field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat())
    name: str = "run"
    algorithm: str
    hyperparameters: dict[str, Any] = Field(default_factory=dict)
    feature_spec: FeatureSpecInfo
    normalization: NormalizationInfo
    action_mapping: str = ACTION_MAPPING
    beta: float = Field(ge=0, lt=1)
    cost_bps: float = Field(ge=0)
    reward: dict[str, Any] = Field(default_factory=dict)
    data: DataInfo
    seed: int = 0
    library_versions: dict[str, str] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    icm: dict[str, Any] | None = None
    widened_from: int | None = None
    export: dict[str, Any] | None = None
    migrations: list[MigrationRecord] = Field(default_factory=list)
    files: dict[str, str] = Field(default_factory=dict, description="file name -> sha256")

    @property
    def max_assets(self) -> int:
        return self.feature_spec.max_assets


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def checksums(directory: str | Path, names: list[str]) -> dict[str, str]:
    """sha256 of each named file in ``directory`` (those that exist)."""
    d = Path(directory)
    return {n: sha256_file(d / n) for n in sorted(names) if (d / n).is_file()}


def verify_checksums(directory: str | Path, manifest: Manifest) -> None:
    """Raise naming the first file that is missing or whose sha256 differs from the manifest."""
    d = Path(directory)
    for name, expected in manifest.files.items():
        path = d / name
        if not path.is_file():
            raise ManifestError(f"{path}: listed in {MANIFEST_FILE} but missing")
        if sha256_file(path) != expected:
            raise ManifestError(
                f"{path}: sha256 does not match {MANIFEST_FILE} (altered or truncated)"
            )


def library_versions() -> dict[str, str]:
    """Versions of the libraries a checkpoint depends on (those installed)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in (
        "allocator",
        "numpy",
        "torch",
        "stable-baselines3",
        "gymnasium",
        "onnx",
        "onnxruntime-gpu",
        "skfolio",
        "pandas",
    ):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            continue
    return out


def read_raw(directory: str | Path) -> dict[str, Any]:
    """The manifest as plain JSON (any schema version), for migration and inspection."""
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        raise ManifestError(f"{path}: no {MANIFEST_FILE} (a version 1 checkpoint? migrate it)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: top level must be an object")
    return raw


def read_manifest(directory: str | Path) -> Manifest:
    """Read and validate a current-version manifest; older versions must be migrated first."""
    path = Path(directory) / MANIFEST_FILE
    raw = read_raw(directory)
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ManifestError(
            f"{path}: schema version {version!r}, this Allocator reads {SCHEMA_VERSION}; run "
            f"`allocator checkpoint migrate {Path(directory)}`"
        )
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise ManifestError(f"{path}: {key}: {first['msg']}") from exc


def write_manifest(directory: str | Path, manifest: Manifest) -> Path:
    """Write ``manifest.json`` atomically (see ``artifacts.files.atomic_write_text``)."""
    text = json.dumps(manifest.model_dump(mode="json"), indent=2) + "\n"
    return atomic_write_text(Path(directory) / MANIFEST_FILE, text)
