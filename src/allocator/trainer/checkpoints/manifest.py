"""Checkpoints: a run directory plus its manifest (schema in ``allocator.artifacts.manifest``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from allocator.artifacts.manifest import (
    DataInfo,
    FeatureSpecInfo,
    Manifest,
    NormalizationInfo,
    checksums,
    library_versions,
    write_manifest,
)
from allocator.portfolio import NormalizationStats
from allocator.trainer.training.config import TrainConfig

MODEL_FILE = "model.zip"
ICM_FILE = "icm.pt"
NORMALIZATION_FILE = "normalization.json"
CONFIG_FILE = "config.yaml"
CHECKPOINT_FILES = [MODEL_FILE, ICM_FILE, NORMALIZATION_FILE, CONFIG_FILE]


def build_manifest(
    config: TrainConfig,
    stats: NormalizationStats,
    universe: list[str],
    metrics: dict[str, Any],
    run_dir: Path,
) -> Manifest:
    """The manifest of a finished run, with checksums of the files now in ``run_dir``."""
    env = config.env
    return Manifest(
        name=config.name,
        algorithm=config.algorithm.name,
        hyperparameters=config.algorithm.model_dump(mode="json"),
        feature_spec=FeatureSpecInfo(
            max_assets=env.max_assets, window=env.window, clip=env.obs_clip
        ),
        normalization=NormalizationInfo(mean=stats.mean, std=stats.std),
        beta=env.beta,
        cost_bps=env.cost_bps,
        reward=env.reward.model_dump(mode="json"),
        data=DataInfo(
            dataset=config.data.dataset,
            universe=universe,
            train_start=str(config.data.train_start),
            train_end=str(config.data.train_end),
            validation_start=str(config.data.validation_start),
            validation_end=str(config.data.validation_end),
        ),
        seed=config.seed,
        library_versions=library_versions(),
        metrics=metrics,
        icm=config.icm.model_dump(mode="json") if config.icm.enabled else None,
        files=checksums(run_dir, CHECKPOINT_FILES),
    )


def refresh_checksums(run_dir: Path, manifest: Manifest) -> Manifest:
    """The manifest with checksums recomputed for the checkpoint files now present."""
    return manifest.model_copy(update={"files": checksums(run_dir, CHECKPOINT_FILES)})


def save_manifest(run_dir: Path, manifest: Manifest) -> Path:
    return write_manifest(run_dir, manifest)


def describe(manifest: Manifest) -> str:
    """A readable summary of a manifest for ``allocator checkpoint inspect``."""
    m = manifest
    lines = [
        f"schema version  {m.schema_version}",
        f"name            {m.name}",
        f"created         {m.created}",
        f"algorithm       {m.algorithm}",
        f"max_assets      {m.feature_spec.max_assets} (window {m.feature_spec.window}, "
        f"features {', '.join(m.feature_spec.features)}, clip {m.feature_spec.clip})",
        f"normalization   mean {m.normalization.mean:.6g}, std {m.normalization.std:.6g}",
        f"action mapping  {m.action_mapping}",
        f"smoothing beta  {m.beta}",
        f"costs           {m.cost_bps} bps",
        f"reward          {m.reward.get('kind', '?')} (scale {m.reward.get('scale', 1.0)})",
        f"data            {m.data.dataset}: train {m.data.train_start} .. {m.data.train_end}, "
        f"validation {m.data.validation_start} .. {m.data.validation_end}",
        f"universe        {', '.join(m.data.universe)}",
        f"seed            {m.seed}",
        f"icm             {'yes' if m.icm else 'no'}",
    ]
    if m.widened_from is not None:
        lines.append(f"widened from    {m.widened_from} assets")
    for name, values in (m.metrics or {}).items():
        if isinstance(values, dict):
            figures = ", ".join(
                f"{k} {v:.4g}"
                for k, v in values.items()
                if k in ("sharpe", "total_return", "max_drawdown", "turnover")
                and isinstance(v, (int, float))
            )
            lines.append(f"metrics         {name}: {figures}")
    if m.export:
        lines.append(f"export          {m.export}")
    for rec in m.migrations:
        lines.append(
            f"migration       v{rec.from_version} -> v{rec.to_version} at {rec.at} {rec.note}"
        )
    lines.append("files")
    lines.extend(f"  {name:<20} sha256 {digest}" for name, digest in m.files.items())
    lines.append("libraries       " + ", ".join(f"{k} {v}" for k, v in m.library_versions.items()))
    return "\n".join(lines)
