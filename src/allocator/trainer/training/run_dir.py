"""The files one training run writes, and the manifest that describes them.

A run directory is a checkpoint: ``model.zip`` (SB3), ``icm.pt`` (curiosity, when enabled),
``normalization.json``, the resolved ``config.yaml`` and ``manifest.json`` (schema in
``allocator.artifacts.manifest``) with a checksum of each checkpoint file, so that export and
upgrades can refuse files changed after training.
"""

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
)
from allocator.portfolio import NormalizationStats
from allocator.trainer.training.config import TrainConfig

MODEL_FILE = "model.zip"
ICM_FILE = "icm.pt"
NORMALIZATION_FILE = "normalization.json"
CONFIG_FILE = "config.yaml"
VALIDATION_FILE = "validation.json"
CHECKPOINT_FILES = [MODEL_FILE, ICM_FILE, NORMALIZATION_FILE, CONFIG_FILE]
"""The files whose checksums the manifest records (those absent from a run are skipped)."""


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
