"""The files one training run writes, and the manifest whose checksums let export and upgrades
refuse files changed after training."""

from __future__ import annotations

import itertools
import json
import zipfile
from pathlib import Path
from typing import Any

from allocator.artifacts.manifest import (
    TILT_MAPPING,
    AnchorInfo,
    DataInfo,
    FeatureNormalizationInfo,
    FeatureSpecInfo,
    Manifest,
    NormalizationInfo,
    PolicyInfo,
    TiltInfo,
    checksums,
    library_versions,
)
from allocator.portfolio import AssetFeatureSpec, FeatureNormalization, NormalizationStats
from allocator.trainer.training.config import TrainConfig

MODEL_FILE = "model.zip"
ICM_FILE = "icm.pt"
NORMALIZATION_FILE = "normalization.json"
FEATURE_NORMALIZATION_FILE = "feature_normalization.json"
CONFIG_FILE = "config.yaml"
VALIDATION_FILE = "validation.json"
RUN_SUMMARY_FILE = "run.json"
BEST_MODEL_FILE = "best_model.zip"
BEST_ICM_FILE = "best_icm.pt"
LAST_MODEL_FILE = "last_model.zip"
LAST_ICM_FILE = "last_icm.pt"
SELECTION_FILE = "selection.json"
CHECKPOINTS_DIR = "checkpoints"
"""With selection, ``model.zip`` (and ``icm.pt``) are the chosen checkpoint, ``last_model.zip``
(``last_icm.pt``) where training ended; ``checkpoints/`` holds the resumable state until the
run finishes."""
CHECKPOINT_FILES = [
    MODEL_FILE,
    ICM_FILE,
    NORMALIZATION_FILE,
    FEATURE_NORMALIZATION_FILE,
    CONFIG_FILE,
]
"""The files whose checksums the manifest records (those absent from a run are skipped)."""


def fresh_path(base: Path) -> Path:
    """``base``, or the first of ``base-1``, ``base-2``, ... that does not exist yet."""
    candidates = itertools.chain([base], (Path(f"{base}-{i}") for i in itertools.count(1)))
    return next(p for p in candidates if not p.exists())


def saved_feature_normalization(run_dir: Path, spec: AssetFeatureSpec) -> FeatureNormalization:
    """The run's ``feature_normalization.json``, refused unless fitted for ``spec``."""
    path = Path(run_dir) / FEATURE_NORMALIZATION_FILE
    try:
        saved = json.loads(path.read_text())
        norm = FeatureNormalization.from_dict(saved)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: cannot read the feature normalization: {exc}") from exc
    if "spec" in saved and AssetFeatureSpec.from_dict(saved["spec"]) != spec:
        raise ValueError(f"{path}: fitted for {saved['spec']}, the config says {spec.to_dict()}")
    if norm.n_features != spec.n_features:
        raise ValueError(f"{path}: {norm.n_features} features, the feature set {spec.n_features}")
    return norm


def saved_center_assets(model_zip: Path) -> bool | None:
    """Whether the shared actor saved in ``model_zip`` centres its asset scores (None: no
    readable model); its ``policy_kwargs`` decide, since a config without the key reads the
    default (on) while the policy saved without the flag loads uncentred."""
    try:
        with zipfile.ZipFile(model_zip) as archive:
            data = json.loads(archive.read("data"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    kwargs = data.get("policy_kwargs")
    return bool(kwargs.get("center_assets", False)) if isinstance(kwargs, dict) else None


def representation_fields(config: TrainConfig, run_dir: Path) -> dict[str, Any]:
    """The manifest fields that say what the policy sees and what its action means (the per-asset
    feature set's normalization read from the run directory)."""
    env = config.env
    fields: dict[str, Any] = {}
    if env.features == "asset_v1":
        spec = env.asset_feature_spec
        fields["feature_spec"] = FeatureSpecInfo.for_assets(env.max_assets, spec)
        norm = saved_feature_normalization(run_dir, spec)
        fields["feature_normalization"] = FeatureNormalizationInfo.of(norm)
    else:
        fields["feature_spec"] = FeatureSpecInfo(
            max_assets=env.max_assets, window=env.window, clip=env.obs_clip
        )
    if config.policy == "shared":
        shared = config.shared
        center = saved_center_assets(Path(run_dir) / MODEL_FILE)
        fields["policy"] = PolicyInfo(
            kind="shared",
            hidden=shared.hidden,
            center_assets=shared.center_assets if center is None else center,
        )
    if env.action.mapping == "tilt":
        fields["action_mapping"] = TILT_MAPPING
        anchor = AnchorInfo.model_validate(env.action.anchor.model_dump())
        fields["tilt"] = TiltInfo(k=env.action.k, anchor=anchor)
    return fields


def build_manifest(
    config: TrainConfig,
    stats: NormalizationStats,
    universe: list[str],
    metrics: dict[str, Any],
    run_dir: Path,
    holds_anchor: bool = False,
) -> Manifest:
    """The manifest of a finished run, with checksums of the files now in ``run_dir`` (which
    must hold ``feature_normalization.json`` already for the per-asset feature set)."""
    env = config.env
    return Manifest(
        name=config.name,
        algorithm=config.algorithm.name,
        hyperparameters=config.algorithm.model_dump(mode="json"),
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
        holds_anchor=holds_anchor,
        icm=config.icm.model_dump(mode="json") if config.icm.enabled else None,
        files=checksums(run_dir, CHECKPOINT_FILES),
        **representation_fields(config, run_dir),
    )
