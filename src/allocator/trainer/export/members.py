"""The runs an export is made of: one run, or a seed ensemble of runs that differ only in their
seed and the statistics fitted from it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from allocator.artifacts.manifest import (
    TILT_MAPPING,
    EnsembleInfo,
    EnsembleMember,
    Manifest,
    sha256_file,
)
from allocator.trainer.export.errors import ExportError
from allocator.trainer.export.loaded_run import LoadedRun
from allocator.trainer.training.run_dir import MODEL_FILE as RUN_MODEL_FILE

COMBINE: Final = "mean_action"
MEMBER_FIELDS = (
    "algorithm",
    "hyperparameters",
    "policy",
    "feature_spec",
    "action_mapping",
    "tilt",
    "max_served_assets",
    "beta",
    "cost_bps",
    "reward",
    "data",
    "icm",
    "widened_from",
)
"""Manifest fields every member of an ensemble must share."""

CURIOSITY_NOTE = (
    "none: an ensemble exports no icm.onnx; each member's curiosity module models its own "
    "policy's transitions, not the averaged policy's"
)


def check_exportable(manifest: Manifest, run_dir: Path) -> None:
    """Refuse a representation no graph kind serves."""
    fs, kind = manifest.feature_spec, manifest.policy.kind
    if kind == "mlp":
        ok = fs.kind == "returns" and manifest.tilt is None
        need = "return-window features and the affine mapping"
    else:
        ok = fs.kind == "asset_v1" and manifest.action_mapping == TILT_MAPPING
        need = "the asset_v1 feature set and the tilt mapping"
    if not ok:
        raise ExportError(
            f"{run_dir}: the {kind} policy with feature set {fs.kind} and mapping "
            f"{manifest.action_mapping} cannot be exported; {kind} policies are served with {need}"
        )


def model_sha256(loaded: LoadedRun) -> str:
    """sha256 of the run's ``model.zip`` (verified by ``load_run`` when the manifest lists it)."""
    listed = loaded.manifest.files.get(RUN_MODEL_FILE)
    return listed if listed is not None else sha256_file(loaded.run_dir / RUN_MODEL_FILE)


def _describe(value: Any) -> str:
    dumped = value.model_dump(mode="json") if hasattr(value, "model_dump") else value
    text = repr(dumped)
    return text if len(text) <= 200 else text[:197] + "..."


def check_members(members: Sequence[LoadedRun]) -> None:
    """Refuse, naming the run and the field, a representation no graph serves, or members that
    are not one config with k seeds."""
    first = members[0]
    check_exportable(first.manifest, first.run_dir)
    seen_models = {model_sha256(first): first.run_dir}
    seen_seeds = {first.manifest.seed: first.run_dir}
    for other in members[1:]:
        for key in MEMBER_FIELDS:
            mine, theirs = getattr(first.manifest, key), getattr(other.manifest, key)
            if mine != theirs:
                raise ExportError(
                    f"{other.run_dir}: {key} is {_describe(theirs)}, but {first.run_dir} has "
                    f"{_describe(mine)}; an ensemble's members must differ only in their seed"
                )
        digest = model_sha256(other)
        if digest in seen_models:
            raise ExportError(
                f"{other.run_dir}: the same model.zip as {seen_models[digest]} (sha256 "
                f"{digest[:12]}...); an ensemble's members are distinct runs"
            )
        if other.manifest.seed in seen_seeds:
            raise ExportError(
                f"{other.run_dir}: seed {other.manifest.seed}, as {seen_seeds[other.manifest.seed]}"
                "; an ensemble's members must differ in their seed"
            )
        seen_models[digest] = other.run_dir
        seen_seeds[other.manifest.seed] = other.run_dir


def ensemble_info(members: Sequence[LoadedRun]) -> EnsembleInfo:
    """The manifest's ``ensemble`` field: each member's run, seed, model and statistics."""
    members_info = [
        EnsembleMember(
            run_id=m.run_dir.resolve().name,
            run_dir=str(m.run_dir.resolve()),
            name=m.manifest.name,
            seed=m.manifest.seed,
            model_sha256=model_sha256(m),
            normalization=m.manifest.normalization,
            feature_normalization=m.manifest.feature_normalization,
            icm=m.manifest.icm is not None,
        )
        for m in members
    ]
    return EnsembleInfo(combine=COMBINE, members=members_info)
