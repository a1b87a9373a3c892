"""Export a finished run to ONNX for serving, checked against torch before it is published.

``export_run`` turns a run directory into a registry version
``registry/NAME/VERSION/{model.onnx, icm.onnx?, manifest.json}``: the graphs
(``export.graphs`` for a flat MLP, ``export.shared_graphs`` for a shared policy) are written to
a scratch directory, compared with torch (``export.parity``, ``export.shared_parity``), and only
then published (``allocator.registry.publish``): staged in a hidden directory beside the
version and renamed into place, so a version appears whole.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from pathlib import Path
from typing import Any

import torch

from allocator.artifacts.manifest import SCHEMA_VERSION, TILT_MAPPING, Manifest, library_versions
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
    ObservationNormalizer,
    PolicyGraph,
    export_graph,
    graph_opset,
    set_axes,
)
from allocator.trainer.export.loaded_run import LoadedRun, load_run
from allocator.trainer.export.parity import (
    PARITY_SAMPLES,
    PARITY_TOLERANCE,
    check_parity,
    measure_parity,
)
from allocator.trainer.export.shared_graphs import AssetObservationNormalizer, SharedPolicyGraph
from allocator.trainer.export.shared_parity import measure_shared_parity
from allocator.trainer.training.tracked_models import register_export
from allocator.trainer.training.tracking import read_tracking, require_mlflow

__all__ = [
    "SHARED_POSTPROCESSING",
    "check_exportable",
    "export_curiosity",
    "export_policy",
    "export_run",
    "export_set_graph",
    "publish",
    "reserve_version",
]

SHARED_POSTPROCESSING = (
    "not in the graph: weights = portfolio.tilt_weights(action, portfolio.anchor_weights("
    "prices, mask, tilt.anchor), mask, tilt.k) in numpy, the functions the environment uses"
)
"""What the manifest's export info says a server does with a shared graph's action."""


def check_exportable(manifest: Manifest, run_dir: Path) -> None:
    """Refuse a representation no graph kind serves: a flat MLP is exported with return
    features and the affine mapping baked in; a shared policy with the per-asset feature set
    and the tilt mapping applied by the server."""
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


def _graph_metadata(loaded: LoadedRun, graph: str) -> dict[str, str]:
    m = loaded.manifest
    if loaded.shared:
        return _shared_metadata(loaded, graph)
    return {
        "allocator.graph": graph,
        "allocator.algorithm": m.algorithm,
        "allocator.action_mapping": m.action_mapping,
        "allocator.max_assets": str(loaded.spec.max_assets),
        "allocator.window": str(loaded.spec.window),
        "allocator.clip": repr(loaded.spec.clip),
        "allocator.normalization_mean": repr(loaded.stats.mean),
        "allocator.normalization_std": repr(loaded.stats.std),
        "allocator.input": "raw observation (portfolio.build_raw_observation) and mask",
    }


def _shared_metadata(loaded: LoadedRun, graph: str) -> dict[str, str]:
    m, spec = loaded.manifest, loaded.asset_spec
    assert loaded.feature_norm is not None
    return {
        "allocator.graph": graph,
        "allocator.algorithm": m.algorithm,
        "allocator.policy": "shared",
        "allocator.action_mapping": m.action_mapping,
        "allocator.max_assets": str(loaded.spec.max_assets),
        "allocator.max_served_assets": str(m.max_served_assets),
        "allocator.feature_spec": repr(spec.to_dict()),
        "allocator.feature_normalization_mean": repr(list(loaded.feature_norm.mean)),
        "allocator.feature_normalization_std": repr(list(loaded.feature_norm.std)),
        "allocator.input": (
            "raw per-asset features (portfolio.asset_features), weights and mask"
            if graph == "policy"
            else "raw flat observations of the training slots (asset_features rows) and mask"
        ),
        "allocator.postprocessing": SHARED_POSTPROCESSING,
    }


def export_shared_policy(loaded: LoadedRun, path: Path) -> Path:
    """Write a shared policy's ``model.onnx``: raw asset features (B, N, F), weights and mask
    (B, N + 1) -> action (B, N + 1), with a dynamic asset axis N."""
    assert loaded.feature_norm is not None
    actor = loaded.model.actor
    graph = SharedPolicyGraph(actor, loaded.feature_norm, loaded.asset_spec.clip)
    return export_set_graph(graph, loaded, path, _graph_metadata(loaded, "policy"))


def export_set_graph(
    graph: torch.nn.Module, loaded: LoadedRun, path: Path, metadata: dict[str, str]
) -> Path:
    """Export a graph with the shared policy's interface (features, weights, mask -> action),
    traced at the training slots and exported with a dynamic asset axis."""
    n, f = loaded.spec.max_assets, loaded.spec.window
    example = (torch.zeros(4, n, f), torch.zeros(4, n + 1), torch.ones(4, n + 1))
    return export_graph(
        graph,
        example,
        SHARED_POLICY_INPUTS,
        SHARED_POLICY_OUTPUTS,
        path,
        metadata,
        dynamic_shapes=set_axes(len(example)),
    )


def export_policy(loaded: LoadedRun, path: Path) -> Path:
    """Write ``model.onnx``: raw observation + mask -> (action, weights) for a flat MLP, the
    set graph (``export_shared_policy``) for a shared policy."""
    if loaded.shared:
        return export_shared_policy(loaded, path)
    graph = PolicyGraph(loaded.deterministic_actor(), loaded.spec, loaded.stats)
    example = (torch.zeros(4, loaded.spec.obs_size), torch.ones(4, loaded.spec.n_slots))
    return export_graph(
        graph, example, POLICY_INPUTS, POLICY_OUTPUTS, path, _graph_metadata(loaded, "policy")
    )


def export_curiosity(loaded: LoadedRun, path: Path) -> Path:
    """Write ``icm.onnx``: raw (previous, action, current) + mask -> intrinsic reward (B, 1)."""
    assert loaded.icm is not None
    normalizer: torch.nn.Module
    if loaded.shared:
        assert loaded.feature_norm is not None
        normalizer = AssetObservationNormalizer(loaded.spec, loaded.feature_norm)
    else:
        normalizer = ObservationNormalizer(loaded.spec, loaded.stats)
    graph = CuriosityGraph(loaded.icm.net, normalizer)
    spec = loaded.spec
    example = (
        torch.zeros(4, spec.obs_size),
        torch.zeros(4, spec.n_slots),
        torch.zeros(4, spec.obs_size),
        torch.ones(4, spec.n_slots),
    )
    return export_graph(
        graph, example, ICM_INPUTS, ICM_OUTPUTS, path, _graph_metadata(loaded, "curiosity")
    )


def _export_info(
    loaded: LoadedRun,
    model_path: Path,
    icm_path: Path | None,
    parity: dict[str, Any],
    tolerance: float,
    name: str,
    version: str,
) -> dict[str, Any]:
    """The manifest's ``export`` section: parity, opset, provenance and the graphs' names."""
    graphs: dict[str, dict[str, Any]] = {
        MODEL_FILE: {"inputs": list(POLICY_INPUTS), "outputs": list(POLICY_OUTPUTS)}
    }
    if loaded.shared:
        graphs[MODEL_FILE] = {
            "inputs": list(SHARED_POLICY_INPUTS),
            "outputs": list(SHARED_POLICY_OUTPUTS),
            "asset_axis": "dynamic",
        }
    if icm_path is not None:
        graphs[ICM_FILE] = {"inputs": list(ICM_INPUTS), "outputs": list(ICM_OUTPUTS)}
    mapping = {
        "action_mapping_in_graph": not loaded.shared,
        "postprocessing": SHARED_POSTPROCESSING if loaded.shared else "in the graph",
    }
    return {
        **mapping,
        "parity": {"tolerance": tolerance, **parity},
        "opset": graph_opset(model_path),
        "exported_at": dt.datetime.now(dt.UTC).isoformat(),
        "source_run": str(loaded.run_dir.resolve()),
        "source_files": dict(loaded.manifest.files),
        "registry_name": name,
        "registry_version": version,
        "graphs": graphs,
        "library_versions": library_versions(),
    }


def reserve_version(registry: str | Path, name: str, version: str | None) -> tuple[str, Path, str]:
    """The checked name, its directory in the registry and the version to publish (the next
    integer unless given), refused as ``ExportError`` before any slow work when it exists."""
    try:
        name = check_name("name", name)
        model_dir = Path(registry) / name
        chosen = next_version(model_dir) if version is None else str(version)
        version = check_name("version", chosen)
        refuse_existing(model_dir / version)
    except PublishError as exc:
        raise ExportError(str(exc)) from exc
    return name, model_dir, version


def publish(files: list[Path], manifest: Manifest, model_dir: Path, version: str) -> Path:
    """``registry.publish_files``, its refusals as ``ExportError``."""
    try:
        return publish_files(files, manifest, model_dir, version)
    except PublishError as exc:
        raise ExportError(str(exc)) from exc


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
    """Export a run to ``registry/NAME/VERSION`` and return that directory.

    NAME defaults to the manifest's name, VERSION to the next integer. Raises ``ExportError``
    (and writes nothing to the registry) when the run cannot be loaded, the version exists, or
    ONNX and torch differ by more than ``tolerance``. A run tracked in MLflow names its MLflow
    run in the manifest's ``export`` section, and the published version is registered there
    too (``training/tracked_models.py``).
    """
    loaded = load_run(run_dir)
    check_exportable(loaded.manifest, Path(run_dir))
    name, model_dir, version = reserve_version(registry, name or loaded.manifest.name, version)
    tracked = read_tracking(Path(run_dir))
    if tracked is not None:  # refused before any work: it will be registered in MLflow
        require_mlflow("exporting a run tracked in MLflow (its tracking.json)")

    with tempfile.TemporaryDirectory(prefix="allocator-export-") as tmp:
        work = Path(tmp)
        model_path = export_policy(loaded, work / MODEL_FILE)
        icm_path = export_curiosity(loaded, work / ICM_FILE) if loaded.icm is not None else None
        measure = measure_shared_parity if loaded.shared else measure_parity
        parity = measure(loaded, model_path, icm_path, n=n_parity, seed=seed)
        check_parity(parity, tolerance)
        info = _export_info(loaded, model_path, icm_path, parity, tolerance, name, version)
        if tracked is not None:  # the MLflow run that trained this version
            info["mlflow_run_id"] = tracked["run_id"]
        update = {"name": name, "export": info, "schema_version": SCHEMA_VERSION}
        manifest = loaded.manifest.model_copy(update=update)
        files = [model_path] + ([icm_path] if icm_path is not None else [])
        version_dir = publish(files, manifest, model_dir, version)
    register_export(Path(run_dir), version_dir)
    return version_dir
