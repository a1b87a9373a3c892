"""Export finished runs to ONNX for serving: one run, or a seed ensemble of runs that differ only
in their seed and the statistics fitted from it; graphs written to a scratch directory, checked
against torch, and only then published whole as ``registry/NAME/VERSION``."""

from __future__ import annotations

import contextlib
import datetime as dt
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import torch

from allocator.artifacts.manifest import (
    SCHEMA_VERSION,
    TILT_MAPPING,
    EnsembleInfo,
    EnsembleMember,
    Manifest,
    library_versions,
    sha256_file,
)
from allocator.registry.errors import PublishError
from allocator.registry.layout import (
    ICM_FILE,
    ICM_INPUTS,
    ICM_OUTPUTS,
    MODEL_FILE,
    POLICY_INPUTS,
    POLICY_OUTPUTS,
    SHARED_POLICY_INPUTS,
    SHARED_POLICY_OUTPUTS,
)
from allocator.registry.publish import check_name, publish_files, refuse_existing
from allocator.registry.versions import next_version
from allocator.trainer.export.errors import ExportError
from allocator.trainer.export.graphs import (
    CuriosityGraph,
    PolicyGraph,
    export_graph,
    graph_opset,
    policy_axes,
)
from allocator.trainer.export.loaded_run import LoadedRun, load_run
from allocator.trainer.export.parity import (
    PARITY_SAMPLES,
    PARITY_TOLERANCE,
    check_parity,
    measure_parity,
)
from allocator.trainer.training.run_dir import MODEL_FILE as RUN_MODEL_FILE
from allocator.trainer.training.tracked_models import register_export
from allocator.trainer.training.tracking import read_tracking, require_mlflow

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
    text = repr(value.model_dump(mode="json") if hasattr(value, "model_dump") else value)
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


SHARED_POSTPROCESSING = (
    "not in the graph: weights = portfolio.tilt_weights(action, portfolio.anchor_weights("
    "prices, mask, tilt.anchor), mask, tilt.k) in numpy, the functions the environment uses"
)
"""What the manifest's export info says a server does with a shared graph's action."""


def graph_metadata(members: Sequence[LoadedRun], graph: str) -> dict[str, str]:
    """The graph's ``metadata_props``: what a server (or a person) can see it was built from."""
    first, single = members[0], len(members) == 1
    m = first.manifest
    meta = {
        "allocator.graph": graph,
        "allocator.algorithm": m.algorithm,
        "allocator.policy": m.policy.kind,
        "allocator.action_mapping": m.action_mapping,
        "allocator.max_assets": str(first.spec.max_assets),
    }
    if first.shared:
        assert first.feature_norm is not None
        meta["allocator.max_served_assets"] = str(m.max_served_assets)
        meta["allocator.feature_spec"] = repr(first.asset_spec.to_dict())
        meta["allocator.input"] = (
            "raw per-asset features (portfolio.asset_features), weights and mask"
            if graph == "policy"
            else "raw flat observations of the training slots (asset_features rows) and mask"
        )
        meta["allocator.postprocessing"] = SHARED_POSTPROCESSING
        if single:
            meta["allocator.feature_normalization_mean"] = repr(list(first.feature_norm.mean))
            meta["allocator.feature_normalization_std"] = repr(list(first.feature_norm.std))
    else:
        meta["allocator.window"] = str(first.spec.window)
        meta["allocator.clip"] = repr(first.spec.clip)
        meta["allocator.input"] = "raw observation (portfolio.build_raw_observation) and mask"
        if single:
            meta["allocator.normalization_mean"] = repr(first.stats.mean)
            meta["allocator.normalization_std"] = repr(first.stats.std)
    if not single:
        meta["allocator.ensemble"] = f"{COMBINE} of {len(members)} members"
        meta["allocator.ensemble_models"] = repr([model_sha256(x) for x in members])
        meta["allocator.ensemble_seeds"] = repr([x.manifest.seed for x in members])
    return meta


POLICY_IO = {
    True: (SHARED_POLICY_INPUTS, SHARED_POLICY_OUTPUTS),
    False: (POLICY_INPUTS, POLICY_OUTPUTS),
}
"""The policy graph's input and output names, by whether the policy is shared."""


def export_policy(members: Sequence[LoadedRun], path: Path) -> Path:
    """Write ``model.onnx`` of one run or a seed ensemble (a shared one's asset axis dynamic)."""
    first = members[0]
    spec = first.spec
    weights, mask = torch.zeros(4, spec.n_slots), torch.ones(4, spec.n_slots)
    example = (
        (torch.zeros(4, spec.max_assets, spec.window), weights, mask)
        if first.shared
        else (torch.zeros(4, spec.obs_size), mask)
    )
    inputs, outputs = POLICY_IO[first.shared]
    metadata = graph_metadata(members, "policy")
    axes = policy_axes(first.shared)
    return export_graph(PolicyGraph(members), example, inputs, outputs, path, metadata, axes)


def export_curiosity(loaded: LoadedRun, path: Path) -> Path:
    """Write ``icm.onnx``: raw (previous, action, current) + mask -> intrinsic reward (B, 1)."""
    spec = loaded.spec
    previous, action = torch.zeros(4, spec.obs_size), torch.zeros(4, spec.n_slots)
    example = (previous, action, torch.zeros_like(previous), torch.ones_like(action))
    metadata = graph_metadata([loaded], "curiosity")
    return export_graph(CuriosityGraph(loaded), example, ICM_INPUTS, ICM_OUTPUTS, path, metadata)


def _export_info(
    members: Sequence[LoadedRun],
    model_path: Path,
    icm_path: Path | None,
    parity: dict[str, Any],
    tolerance: float,
    registry: tuple[str, str],
) -> dict[str, Any]:
    """The manifest's ``export`` section: parity, opset, provenance and the graphs' names."""
    first = members[0]
    inputs, outputs = POLICY_IO[first.shared]
    graph: dict[str, Any] = {"inputs": list(inputs), "outputs": list(outputs)}
    if first.shared:
        graph["asset_axis"] = "dynamic"
    graphs = {MODEL_FILE: graph}
    if icm_path is not None:
        graphs[ICM_FILE] = {"inputs": list(ICM_INPUTS), "outputs": list(ICM_OUTPUTS)}
    info: dict[str, Any] = {
        "action_mapping_in_graph": not first.shared,
        "postprocessing": SHARED_POSTPROCESSING if first.shared else "in the graph",
        "parity": {"tolerance": tolerance, **parity},
        "opset": graph_opset(model_path),
        "exported_at": dt.datetime.now(dt.UTC).isoformat(),
        "registry_name": registry[0],
        "registry_version": registry[1],
        "graphs": graphs,
        "library_versions": library_versions(),
    }
    if len(members) == 1:
        info["source_run"] = str(first.run_dir.resolve())
        info["source_files"] = dict(first.manifest.files)
    else:
        info["ensemble"] = f"{COMBINE}: the mean of {len(members)} members' deterministic actions"
        info["curiosity"] = CURIOSITY_NOTE
        info["parity"]["reference"] = "torch mean of the members"
        info["source_runs"] = [str(m.run_dir.resolve()) for m in members]
    return info


def _manifest(members: Sequence[LoadedRun], export: dict[str, Any], name: str) -> Manifest:
    """The first member's manifest with the export section; an ensemble's lists its members, has
    no curiosity or metrics, and is validated again (``model_copy`` would not)."""
    first = members[0].manifest
    update = {"name": name, "export": export, "schema_version": SCHEMA_VERSION}
    if len(members) == 1:
        return first.model_copy(update=update)
    ensemble = ensemble_info(members).model_dump()
    fields = {**first.model_dump(), **update, "icm": None, "metrics": {}, "ensemble": ensemble}
    fields["holds_anchor"] = all(m.manifest.holds_anchor for m in members)  # a mean of zeros
    return Manifest.model_validate(fields)


@contextlib.contextmanager
def _refused_as_export_error() -> Iterator[None]:
    """The registry's refusals (``PublishError``) as ``ExportError``."""
    try:
        yield
    except PublishError as exc:
        raise ExportError(str(exc)) from exc


def _reserve_version(registry: str | Path, name: str, version: str | None) -> tuple[str, Path, str]:
    """Name, its registry directory and the version to publish, refused before any slow work."""
    with _refused_as_export_error():
        name = check_name("name", name)
        model_dir = Path(registry) / name
        chosen = next_version(model_dir) if version is None else str(version)
        version = check_name("version", chosen)
        refuse_existing(model_dir / version)
    return name, model_dir, version


def export_runs(
    run_dirs: Sequence[str | Path],
    registry: str | Path,
    name: str | None = None,
    version: str | None = None,
    *,
    tolerance: float = PARITY_TOLERANCE,
    n_parity: int = PARITY_SAMPLES,
    seed: int = 0,
) -> Path:
    """Export one run, or several as a seed ensemble, to ``registry/NAME/VERSION`` (a single run
    tracked in MLflow is registered there too); a refusal or parity above ``tolerance`` raises
    ``ExportError`` with nothing written to the registry."""
    if not run_dirs:
        raise ExportError("nothing to export: no run directory given")
    members = [load_run(d) for d in run_dirs]
    check_members(members)
    first = members[0]
    name, model_dir, version = _reserve_version(registry, name or first.manifest.name, version)
    tracked = read_tracking(Path(run_dirs[0])) if len(run_dirs) == 1 else None
    if tracked is not None:  # refused before any work: it will be registered in MLflow
        require_mlflow("exporting a run tracked in MLflow (its tracking.json)")
    with tempfile.TemporaryDirectory(prefix="allocator-export-") as tmp:
        model_path = export_policy(members, Path(tmp) / MODEL_FILE)
        icm_path = None
        if len(members) == 1 and first.icm is not None:
            icm_path = export_curiosity(first, Path(tmp) / ICM_FILE)
        parity = measure_parity(members, model_path, icm_path, n=n_parity, seed=seed)
        check_parity(parity, tolerance)
        info = _export_info(members, model_path, icm_path, parity, tolerance, (name, version))
        if tracked is not None:  # the MLflow run that trained this version
            info["mlflow_run_id"] = tracked["run_id"]
        files = [model_path] + ([icm_path] if icm_path is not None else [])
        with _refused_as_export_error():
            version_dir = publish_files(files, _manifest(members, info, name), model_dir, version)
    if tracked is not None:
        register_export(Path(run_dirs[0]), version_dir)
    return version_dir


def export_run(
    run_dir: str | Path,
    registry: str | Path,
    name: str | None = None,
    version: str | None = None,
    *,
    tolerance: float = PARITY_TOLERANCE,
    n_parity: int = PARITY_SAMPLES,
    seed: int = 0,
) -> Path:
    """Export a run to ``registry/NAME/VERSION`` and return that directory (``export_runs``)."""
    return export_runs(
        [run_dir], registry, name, version, tolerance=tolerance, n_parity=n_parity, seed=seed
    )
