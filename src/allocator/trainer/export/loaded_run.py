"""A finished run, read back and verified, with the torch reference the export is checked on."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from allocator.artifacts.manifest import Manifest, ManifestError, read_manifest, verify_checksums
from allocator.portfolio import (
    AssetFeatureSpec,
    FeatureNormalization,
    FeatureSpec,
    NormalizationStats,
)
from allocator.trainer.agents.algorithms import ALGORITHMS, Algorithm
from allocator.trainer.agents.icm import ICMSettings, IntrinsicCuriosity
from allocator.trainer.export.errors import ExportError
from allocator.trainer.training.run_dir import (
    FEATURE_NORMALIZATION_FILE,
    ICM_FILE,
    MODEL_FILE,
    NORMALIZATION_FILE,
)

Float32Array = NDArray[np.float32]
FloatArray = NDArray[np.floating[Any]]


@dataclass
class LoadedRun:
    """A run's model, optional curiosity module and the contract they were trained under;
    ``spec`` is the flat observation's layout, ``feature_norm`` set for ``asset_v1`` only."""

    run_dir: Path
    manifest: Manifest
    model: Algorithm
    spec: FeatureSpec
    stats: NormalizationStats
    icm: IntrinsicCuriosity | None
    feature_norm: FeatureNormalization | None = None

    @property
    def shared(self) -> bool:
        return self.manifest.policy.kind == "shared"

    @property
    def asset_spec(self) -> AssetFeatureSpec:
        return self.manifest.feature_spec.asset_spec()

    @property
    def squashed_gaussian(self) -> bool:
        return self.manifest.algorithm == "sac"

    @property
    def observation_norm(self) -> NormalizationStats | FeatureNormalization:
        """The statistics of the flat observation's feature block: per asset for a shared run."""
        return self.stats if self.feature_norm is None else self.feature_norm

    @torch.no_grad()
    def reference_action(self, obs: FloatArray) -> Float32Array:
        """The torch reference: SB3's own deterministic actor call on normalized observations."""
        x, actor = torch.as_tensor(np.asarray(obs, dtype=np.float32)), self.model.actor
        out = actor(x, deterministic=True) if self.squashed_gaussian else actor(x)
        return out.numpy().astype(np.float32)

    @torch.no_grad()
    def reference_set_action(
        self, features: FloatArray, weights: FloatArray, mask: FloatArray
    ) -> Float32Array:
        """The torch reference of a shared actor on any number of assets (``forward_sets``)."""
        args = (torch.as_tensor(np.asarray(x, dtype=np.float32)) for x in (features, weights, mask))
        return self.model.actor.forward_sets(*args).numpy().astype(np.float32)  # type: ignore[operator]


def _check_saved(run_dir: Path, field: str, file: str, ours: Any) -> None:
    """The manifest's statistics must be those the run saved in ``file`` (it has no checksum)."""
    path = run_dir / file
    if ours is None or not path.is_file():
        return
    try:
        saved = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ExportError(f"{path}: not valid JSON: {exc}") from exc
    pair = (saved.get("mean"), saved.get("std")) if isinstance(saved, dict) else None
    if pair != (ours.mean, ours.std):
        raise ExportError(
            f"{run_dir}: manifest {field} differs from the run's {file} (manifest: mean "
            f"{ours.mean}, std {ours.std}; file: {saved}); the manifest was altered"
        )


def load_run(run_dir: str | Path) -> LoadedRun:
    """Read, verify and load a run directory on CPU; every problem raises ``ExportError``."""
    d = Path(run_dir)
    if not d.is_dir():
        raise ExportError(f"{d}: not a run directory (no such directory)")
    try:
        manifest = read_manifest(d)
        verify_checksums(d, manifest)
    except ManifestError as exc:
        raise ExportError(str(exc)) from exc
    _check_saved(d, "normalization", NORMALIZATION_FILE, manifest.normalization)
    features = manifest.feature_normalization
    _check_saved(d, "feature_normalization", FEATURE_NORMALIZATION_FILE, features)
    if not (d / MODEL_FILE).is_file():
        raise ExportError(f"{d / MODEL_FILE}: missing")
    spec = manifest.feature_spec.layout
    stats = NormalizationStats(mean=manifest.normalization.mean, std=manifest.normalization.std)
    if manifest.algorithm not in ALGORITHMS:
        raise ExportError(f"algorithm {manifest.algorithm!r} cannot be exported (known: td3, sac)")
    try:
        model = ALGORITHMS[manifest.algorithm].load(d / MODEL_FILE, device="cpu")
    except Exception as exc:
        raise ExportError(
            f"{d / MODEL_FILE}: cannot load the {manifest.algorithm} model: {exc}"
        ) from exc
    model.policy.set_training_mode(False)
    shared = callable(getattr(model.actor, "forward_sets", None))  # the shared actor's
    if shared != (manifest.policy.kind == "shared"):
        raise ExportError(
            f"{d / MODEL_FILE}: a {'shared' if shared else 'mlp'} policy, but the manifest says "
            f"policy {manifest.policy.kind!r}"
        )
    obs_shape = tuple(model.observation_space.shape or ())
    act_space = model.action_space
    if obs_shape != (spec.obs_size,):
        raise ExportError(
            f"{d / MODEL_FILE}: observation shape {obs_shape} does not match the manifest's "
            f"feature spec ({spec.obs_size},)"
        )
    low, high = np.asarray(act_space.low), np.asarray(act_space.high)  # type: ignore[attr-defined]
    if tuple(act_space.shape or ()) != (spec.n_slots,) or not (
        np.all(low == -1.0) and np.all(high == 1.0)
    ):
        raise ExportError(
            f"{d / MODEL_FILE}: action space must be [-1, 1]^{spec.n_slots} (cash + max_assets)"
        )
    icm = None
    if manifest.icm is not None and (d / ICM_FILE).is_file():
        try:
            icm = IntrinsicCuriosity.load(
                d / ICM_FILE, spec.obs_size, spec.n_slots, ICMSettings(**manifest.icm)
            )
        except Exception as exc:
            raise ExportError(f"{d / ICM_FILE}: cannot load the curiosity module: {exc}") from exc
        icm.net.eval()
    feature_norm = features.normalization() if features is not None else None
    return LoadedRun(d, manifest, model, spec, stats, icm, feature_norm)
