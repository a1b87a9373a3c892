"""``allocator checkpoint migrate``: upgrade a run directory to the current schema, and widen it,
behind a backup that any failure restores; the result must act exactly as the backup did."""

from __future__ import annotations

import datetime as dt
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from allocator.artifacts.manifest import (
    SCHEMA_VERSION,
    Manifest,
    ManifestError,
    read_manifest,
    verify_checksums,
    write_manifest,
)
from allocator.trainer.checkpoints.errors import CheckpointUpgradeError
from allocator.trainer.checkpoints.probes import ProbeReport, check_same_actions, check_widened
from allocator.trainer.checkpoints.versions import STEPS, detect_version
from allocator.trainer.checkpoints.widening import widen
from allocator.trainer.market.data import DataError
from allocator.trainer.training.config import load_config
from allocator.trainer.training.run_dir import CONFIG_FILE, MODEL_FILE, fresh_path
from allocator.typed_config import ConfigError


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
