"""Schema versions of a run directory and the steps between them. 1: no manifest; 2:
``manifest.json``; 3: it records the policy kind, feature set, action mapping and served assets.
"""

from __future__ import annotations

import datetime as dt
import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from allocator.artifacts.manifest import (
    MANIFEST_FILE,
    Manifest,
    ManifestError,
    MigrationRecord,
    read_manifest,
    read_raw,
    write_manifest,
)
from allocator.portfolio import NormalizationStats
from allocator.trainer.checkpoints.errors import CheckpointUpgradeError
from allocator.trainer.market.data import DATABASE, SP500, DataError, load_dataset
from allocator.trainer.training.config import TrainConfig, load_config
from allocator.trainer.training.run_dir import (
    CONFIG_FILE,
    MODEL_FILE,
    NORMALIZATION_FILE,
    VALIDATION_FILE,
    build_manifest,
    representation_fields,
)
from allocator.typed_config import ConfigError

V1_REQUIRED = (MODEL_FILE, CONFIG_FILE, NORMALIZATION_FILE)
"""The files without which a directory with no manifest is not a version-1 run."""


def detect_version(run_dir: str | Path) -> int:
    """Schema version of a run directory: 1 without ``manifest.json``, else the manifest's."""
    d = Path(run_dir)
    if not d.is_dir():
        raise CheckpointUpgradeError(f"{d}: no such directory")
    if not (d / MANIFEST_FILE).is_file():
        missing = [n for n in V1_REQUIRED if not (d / n).is_file()]
        if missing:
            raise CheckpointUpgradeError(
                f"{d}: not a run directory (no {MANIFEST_FILE}, and no {', '.join(missing)})"
            )
        return 1
    version = read_raw(d).get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise CheckpointUpgradeError(
            f"{d / MANIFEST_FILE}: schema_version {version!r} is not an integer"
        )
    return version


def training_record(model_zip: Path) -> tuple[dt.datetime, dict[str, str]]:
    """When training started and the library versions it used, as SB3 recorded them in the zip
    (a copied or checked-out file's mtime says nothing; the mtime is only the fallback)."""
    keys = {
        "Stable-Baselines3": "stable-baselines3",
        "PyTorch": "torch",
        "Numpy": "numpy",
        "Gymnasium": "gymnasium",
    }
    started = dt.datetime.fromtimestamp(model_zip.stat().st_mtime, dt.UTC)
    try:
        with zipfile.ZipFile(model_zip) as archive:
            names = set(archive.namelist())
            if "data" in names:
                ns = json.loads(archive.read("data")).get("start_time")
                if isinstance(ns, int) and ns > 0:
                    started = dt.datetime.fromtimestamp(ns / 1e9, dt.UTC)
            info = archive.read("system_info.txt").decode() if "system_info.txt" in names else ""
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise CheckpointUpgradeError(f"{model_zip}: not a readable SB3 model: {exc}") from exc
    pairs = (line.lstrip("- ").partition(":") for line in info.splitlines())
    return started, {keys[k.strip()]: v.strip() for k, sep, v in pairs if sep and k.strip() in keys}


def training_universe(run_dir: Path, config: TrainConfig) -> tuple[list[str], str]:
    """The assets training drew from (``data.assets``, else the dataset's), and their source."""
    if config.data.assets:
        return list(config.data.assets), "config data.assets"
    # A relative path is tried beside the run directory first (self-contained runs and
    # fixtures), then in the working directory (where training resolved it).
    source: str | Path = config.data.dataset
    if source not in (SP500, DATABASE) and (run_dir / source).exists():
        source = run_dir / source
    try:
        data = load_dataset(source)
    except DataError as exc:
        raise CheckpointUpgradeError(
            f"{run_dir}: the config lists no data.assets, so the universe comes from the dataset, "
            f"which cannot be loaded: {exc}"
        ) from exc
    train_data = data.between(config.data.train_start, config.data.train_end)
    return list(train_data.assets), f"dataset {source} training period"


def v1_to_v2(run_dir: Path, at: str) -> Manifest:
    """Write the manifest a version-1 run would have had, from the files it already holds."""
    try:
        config = load_config(run_dir / CONFIG_FILE)
    except ConfigError as exc:
        raise CheckpointUpgradeError(str(exc)) from exc
    try:
        stats = NormalizationStats(**json.loads((run_dir / NORMALIZATION_FILE).read_text()))
    except (ValueError, TypeError) as exc:
        raise CheckpointUpgradeError(f"{run_dir / NORMALIZATION_FILE}: {exc}") from exc
    validation_path = run_dir / VALIDATION_FILE
    metrics: dict[str, Any] = {}
    if validation_path.is_file():
        metrics = json.loads(validation_path.read_text()).get("metrics", {})
    universe, universe_source = training_universe(run_dir, config)
    manifest = build_manifest(config, stats, universe, metrics, run_dir)
    started, versions = training_record(run_dir / MODEL_FILE)
    note = (
        f"manifest built from {CONFIG_FILE}, {NORMALIZATION_FILE}, "
        f"{VALIDATION_FILE if metrics else 'no metrics'}; universe from {universe_source}; "
        f"created and library versions as recorded in {MODEL_FILE}"
    )
    manifest = manifest.model_copy(
        update={
            "schema_version": 2,
            "created": started.isoformat(),
            "library_versions": versions,
            "migrations": [MigrationRecord(from_version=1, to_version=2, at=at, note=note)],
        }
    )
    write_manifest(run_dir, manifest)
    return manifest


def v2_to_v3(run_dir: Path, at: str) -> Manifest:
    """Rewrite a version-2 manifest as version 3, its representation read from the run's config
    (without one, an exported flat MLP: the defaults are what schema 2 meant)."""
    try:
        manifest = read_manifest(run_dir)
    except ManifestError as exc:
        raise CheckpointUpgradeError(str(exc)) from exc
    fields: dict[str, Any] = {}
    source = "defaults (flat MLP, return window, affine mapping)"
    if (run_dir / CONFIG_FILE).is_file():
        try:
            fields = representation_fields(load_config(run_dir / CONFIG_FILE), run_dir)
        except (ConfigError, ValueError) as exc:
            raise CheckpointUpgradeError(f"{run_dir}: {exc}") from exc
        source = CONFIG_FILE
    if "feature_spec" in fields and fields["feature_spec"].kind == "returns":
        fields["feature_spec"] = manifest.feature_spec  # keep what v2 recorded, widening included
    note = f"policy, feature set and action mapping from {source}"
    record = MigrationRecord(from_version=2, to_version=3, at=at, note=note)
    data = {
        **manifest.model_dump(),
        **{k: v.model_dump() if hasattr(v, "model_dump") else v for k, v in fields.items()},
        "schema_version": 3,
        "migrations": [*manifest.model_dump()["migrations"], record.model_dump()],
    }
    try:
        upgraded = Manifest.model_validate(data)
    except ValueError as exc:
        raise CheckpointUpgradeError(f"{run_dir / MANIFEST_FILE}: {exc}") from exc
    write_manifest(run_dir, upgraded)
    return upgraded


STEPS: dict[int, Callable[[Path, str], Manifest]] = {1: v1_to_v2, 2: v2_to_v3}
"""``STEPS[n]`` rewrites a version-n run directory in place as version n + 1."""
