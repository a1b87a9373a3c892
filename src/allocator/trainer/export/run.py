"""Export a finished run to ONNX for serving, checked against torch before it is published.

``export_run`` turns a run directory into a registry version
``registry/NAME/VERSION/{model.onnx, icm.onnx?, manifest.json}``: the graphs
(``export.graphs``) are written to a scratch directory, compared with torch
(``export.parity``), and only then published (``allocator.registry.publish``): staged in a
hidden directory beside the version and renamed into place, so a version appears whole.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from pathlib import Path
from typing import Any

import torch

from allocator.artifacts.manifest import library_versions
from allocator.registry.errors import PublishError
from allocator.registry.layout import (
    ICM_FILE,
    ICM_INPUTS,
    ICM_OUTPUTS,
    MODEL_FILE,
    POLICY_INPUTS,
    POLICY_OUTPUTS,
)
from allocator.registry.publish import check_name, publish_files, refuse_existing
from allocator.registry.versions import next_version
from allocator.trainer.export.errors import ExportError
from allocator.trainer.export.graphs import CuriosityGraph, PolicyGraph, export_graph, graph_opset
from allocator.trainer.export.loaded_run import LoadedRun, load_run
from allocator.trainer.export.parity import (
    PARITY_SAMPLES,
    PARITY_TOLERANCE,
    check_parity,
    measure_parity,
)

__all__ = ["export_curiosity", "export_policy", "export_run"]


def _graph_metadata(loaded: LoadedRun, graph: str) -> dict[str, str]:
    m = loaded.manifest
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


def export_policy(loaded: LoadedRun, path: Path) -> Path:
    """Write ``model.onnx``: raw observation + mask -> (action, weights)."""
    graph = PolicyGraph(loaded.deterministic_actor(), loaded.spec, loaded.stats)
    example = (torch.zeros(4, loaded.spec.obs_size), torch.ones(4, loaded.spec.n_slots))
    return export_graph(
        graph, example, POLICY_INPUTS, POLICY_OUTPUTS, path, _graph_metadata(loaded, "policy")
    )


def export_curiosity(loaded: LoadedRun, path: Path) -> Path:
    """Write ``icm.onnx``: raw (previous, action, current) + mask -> intrinsic reward (B, 1)."""
    assert loaded.icm is not None
    graph = CuriosityGraph(loaded.icm.net, loaded.spec, loaded.stats)
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
    graphs = {MODEL_FILE: {"inputs": list(POLICY_INPUTS), "outputs": list(POLICY_OUTPUTS)}}
    if icm_path is not None:
        graphs[ICM_FILE] = {"inputs": list(ICM_INPUTS), "outputs": list(ICM_OUTPUTS)}
    return {
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
    ONNX and torch differ by more than ``tolerance``.
    """
    loaded = load_run(run_dir)
    try:
        name = check_name("name", name or loaded.manifest.name)
        model_dir = Path(registry) / name
        chosen = next_version(model_dir) if version is None else str(version)
        version = check_name("version", chosen)
        refuse_existing(model_dir / version)  # before the slow part
    except PublishError as exc:
        raise ExportError(str(exc)) from exc

    with tempfile.TemporaryDirectory(prefix="allocator-export-") as tmp:
        work = Path(tmp)
        model_path = export_policy(loaded, work / MODEL_FILE)
        icm_path = export_curiosity(loaded, work / ICM_FILE) if loaded.icm is not None else None
        parity = measure_parity(loaded, model_path, icm_path, n=n_parity, seed=seed)
        check_parity(parity, tolerance)
        info = _export_info(loaded, model_path, icm_path, parity, tolerance, name, version)
        manifest = loaded.manifest.model_copy(update={"name": name, "export": info})
        files = [model_path] + ([icm_path] if icm_path is not None else [])
        try:
            return publish_files(files, manifest, model_dir, version)
        except PublishError as exc:
            raise ExportError(str(exc)) from exc
