"""``allocator checkpoint migrate``: upgrade a run directory to the current schema, and widen it,
behind a backup that any failure restores; the result must act exactly as the backup did.
Schema versions: 1, no manifest; 2, ``manifest.json``; 3, it records the policy kind, feature set,
action mapping and served assets. ``STEPS`` go from one to the next.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocator.artifacts.manifest import (
    MANIFEST_FILE,
    SCHEMA_VERSION,
    Manifest,
    ManifestError,
    MigrationRecord,
    read_manifest,
    read_raw,
    verify_checksums,
    write_manifest,
)
from allocator.portfolio import NormalizationStats
from allocator.trainer.checkpoints.errors import CheckpointUpgradeError
from allocator.trainer.checkpoints.probes import ProbeReport, check_same_actions, check_widened
from allocator.trainer.checkpoints.widening import widen
from allocator.trainer.market.data import DATABASE, SP500, DataError, load_dataset
from allocator.trainer.training.config import TrainConfig, load_config
from allocator.trainer.training.run_dir import (
    CONFIG_FILE,
    MODEL_FILE,
    NORMALIZATION_FILE,
    VALIDATION_FILE,
    build_manifest,
    fresh_path,
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


@dataclass(frozen=True)
class UpgradeResult:
    """What ``upgrade_run`` did: versions, the backup it made, and the post-upgrade check."""

    manifest: Manifest
    run_dir: Path
    backup: Path
    from_version: int
    to_version: int
    probe: ProbeReport
    widened_from: int | None = None


def current_max_assets(run_dir: Path, version: int) -> int:
    """The asset slots a run directory has now: its manifest's, or a version-1 run's config's."""
    if version >= 2:
        return read_manifest(run_dir).feature_spec.max_assets
    try:
        return load_config(run_dir / CONFIG_FILE).env.max_assets
    except ConfigError as exc:
        raise CheckpointUpgradeError(str(exc)) from exc


def is_shared(run_dir: Path, version: int) -> bool:
    """Whether a run directory holds a shared policy (its schema-3 manifest, else its config)."""
    if version == SCHEMA_VERSION:
        return read_manifest(run_dir).policy.kind == "shared"
    try:
        return load_config(run_dir / CONFIG_FILE).policy == "shared"
    except ConfigError:
        return False


def preflight(d: Path, to_version: int, max_assets: int | None) -> tuple[int, int, bool]:
    """(version, current max_assets, widening?), or why the upgrade is refused."""
    version = detect_version(d)
    known = range(1, SCHEMA_VERSION + 1)
    if version not in known:
        raise CheckpointUpgradeError(
            f"{d}: schema version {version} is unknown to this Allocator (it knows "
            f"{known.start}..{known.stop - 1}); a newer Allocator wrote it?"
        )
    if to_version not in known:
        raise CheckpointUpgradeError(
            f"unknown target schema version {to_version} (known: {known.start}..{known.stop - 1})"
        )
    if to_version < version:
        raise CheckpointUpgradeError(
            f"{d}: is at schema version {version}; cannot downgrade to {to_version}"
        )
    if max_assets is not None and to_version != SCHEMA_VERSION:
        raise CheckpointUpgradeError(f"widening needs the current schema version {SCHEMA_VERSION}")
    if version == SCHEMA_VERSION:
        verify_checksums(d, read_manifest(d))  # never bless altered files with new checksums
    current = current_max_assets(d, version)
    if max_assets is not None and max_assets < current:
        raise CheckpointUpgradeError(
            f"{d}: max_assets {max_assets} is below the current max_assets {current}; "
            "a checkpoint can only be widened"
        )
    widening = max_assets is not None and max_assets > current
    if widening and is_shared(d, version):
        raise CheckpointUpgradeError(
            f"{d}: a shared policy is never widened: it serves any number of assets (up to the "
            "manifest's max_served_assets) as it is; only a flat MLP policy can be widened"
        )
    exported = version >= 2 and read_manifest(d).export is not None
    if widening and (exported or not (d / MODEL_FILE).is_file()):
        raise CheckpointUpgradeError(
            f"{d}: no {MODEL_FILE} here (an exported model?); widen the run directory it came "
            "from and export that again"
        )
    if to_version == version and not widening:
        raise CheckpointUpgradeError(
            f"{d}: already at schema version {version}"
            + (f" with max_assets {current}" if max_assets is not None else "")
            + "; nothing to migrate"
        )
    return version, current, widening


def _apply_and_check(
    d: Path, backup: Path, version: int, to_version: int, widen_to: int | None, at: str
) -> tuple[Manifest, ProbeReport]:
    """Run the version steps, widen (``widen_to`` not None), and probe against the backup."""
    for step in range(version, to_version):
        STEPS[step](d, at)
    manifest = read_manifest(d)
    algorithm, spec = manifest.algorithm, manifest.feature_spec.layout
    if not (d / MODEL_FILE).is_file():  # an exported version: only its manifest changed
        return manifest, ProbeReport(observations=0, masks=0, float32_max_diff=0.0)
    if widen_to is not None:
        manifest = widen(d, widen_to, at)
        return manifest, check_widened(algorithm, backup, d, spec, widen_to)
    return manifest, check_same_actions(algorithm, backup, d, spec)


def _note_backup_and_probe(
    d: Path, manifest: Manifest, records_before: int, backup: Path, probe: ProbeReport
) -> Manifest:
    """Note the backup and the probe (what it compared, the largest difference) in this upgrade's
    records; write and verify the manifest."""
    tail = f"; backup {backup}; probe: {probe.observations} observations"
    if probe.canonical_max_diff is not None:  # widened
        tail += (
            f" over {probe.masks} masks, canonical max |diff| {probe.canonical_max_diff:g}, "
            f"float32 max |diff| {probe.float32_max_diff:.3g}"
        )
    else:
        tail += f", max |action diff| {probe.float32_max_diff:g}"
    records = [
        r.model_copy(update={"note": r.note + tail}) if i >= records_before else r
        for i, r in enumerate(manifest.migrations)
    ]
    manifest = manifest.model_copy(update={"migrations": records})
    write_manifest(d, manifest)
    verify_checksums(d, read_manifest(d))
    return manifest


def upgrade_run(
    run_dir: str | Path, to_version: int = SCHEMA_VERSION, max_assets: int | None = None
) -> UpgradeResult:
    """Upgrade ``run_dir`` to ``to_version`` (and widen it to ``max_assets`` slots), in place;
    a bad request is refused before anything is touched."""
    d = Path(run_dir).resolve()
    try:
        version, current, widening = preflight(d, to_version, max_assets)
    except ManifestError as exc:
        raise CheckpointUpgradeError(str(exc)) from exc

    at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    stamp = time.strftime("%Y%m%d-%H%M%S")  # the backup: a fresh sibling, copied whole
    backup = fresh_path(d.with_name(f"{d.name}.bak-v{version}-{stamp}"))
    shutil.copytree(d, backup, symlinks=True)
    records_before = 0 if version == 1 else len(read_manifest(d).migrations)
    try:
        widen_to = max_assets if widening else None
        manifest, probe = _apply_and_check(d, backup, version, to_version, widen_to, at)
        manifest = _note_backup_and_probe(d, manifest, records_before, backup, probe)
    except BaseException as exc:  # put the backup back in place of the failed upgrade
        shutil.rmtree(d)
        shutil.copytree(backup, d, symlinks=True)
        if isinstance(exc, CheckpointUpgradeError | ManifestError | DataError | ConfigError):
            raise CheckpointUpgradeError(f"{exc} (restored {d} from {backup})") from exc
        raise
    return UpgradeResult(
        manifest=manifest,
        run_dir=d,
        backup=backup,
        from_version=version,
        to_version=to_version,
        probe=probe,
        widened_from=current if widening else None,
    )
