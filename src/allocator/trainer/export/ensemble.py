"""Export a seed ensemble: k runs that differ only in their seed, as one ONNX model version.

``export_ensemble`` loads every run (``load_run``: checksums, statistics, the model), refuses
members that differ in anything but the seed and the statistics fitted from it, builds one
graph whose action is the mean of the members' deterministic actions
(``export.ensemble_graphs``), checks it against the torch mean (``export.ensemble_parity``), and
publishes it like a single model: the same inputs and outputs, so the server loads and serves
it unchanged. The manifest is the first member's, with the members listed in ``ensemble``
(run, seed, sha256 of ``model.zip``, their own statistics) and no curiosity graph: each
member's curiosity module models its own policy's transitions, and the monitoring signal of an
averaged policy would be none of theirs.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import torch

from allocator.artifacts.manifest import (
    SCHEMA_VERSION,
    EnsembleInfo,
    EnsembleMember,
    Manifest,
    library_versions,
    sha256_file,
)
from allocator.registry.layout import (
    MODEL_FILE,
    POLICY_INPUTS,
    POLICY_OUTPUTS,
    SHARED_POLICY_INPUTS,
    SHARED_POLICY_OUTPUTS,
)
from allocator.trainer.export.ensemble_graphs import (
    EnsemblePolicyGraph,
    SharedEnsemblePolicyGraph,
)
from allocator.trainer.export.ensemble_parity import measure_ensemble_parity
from allocator.trainer.export.errors import ExportError
from allocator.trainer.export.graphs import export_graph, graph_opset
from allocator.trainer.export.loaded_run import LoadedRun, load_run
from allocator.trainer.export.parity import PARITY_SAMPLES, PARITY_TOLERANCE, check_parity
from allocator.trainer.export.run import (
    SHARED_POSTPROCESSING,
    check_exportable,
    export_set_graph,
    publish,
    reserve_version,
)
from allocator.trainer.training.run_dir import MODEL_FILE as RUN_MODEL_FILE

__all__ = [
    "COMBINE",
    "MEMBER_FIELDS",
    "check_members",
    "ensemble_info",
    "export_ensemble",
    "export_ensemble_policy",
]

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
"""Manifest fields every member must share: the representation (features, window, clip,
max_assets, mapping, k, anchor), the training setup and data. Only the seed, and the statistics
each run fitted, may differ."""

CURIOSITY_NOTE = (
    "none: an ensemble exports no icm.onnx; each member's curiosity module models its own "
    "policy's transitions, not the averaged policy's"
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
    """Refuse, naming the run and the field, members that are not one config with k seeds."""
    if len(members) < 2:
        raise ExportError(f"an ensemble needs at least 2 runs, got {len(members)}")
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
    out = []
    for m in members:
        out.append(
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
        )
    return EnsembleInfo(combine=COMBINE, members=out)


def _metadata(members: Sequence[LoadedRun]) -> dict[str, str]:
    first = members[0]
    m = first.manifest
    meta = {
        "allocator.graph": "policy",
        "allocator.algorithm": m.algorithm,
        "allocator.policy": m.policy.kind,
        "allocator.action_mapping": m.action_mapping,
        "allocator.max_assets": str(first.spec.max_assets),
        "allocator.ensemble": f"{COMBINE} of {len(members)} members",
        "allocator.ensemble_models": repr([model_sha256(x) for x in members]),
        "allocator.ensemble_seeds": repr([x.manifest.seed for x in members]),
    }
    if first.shared:
        meta["allocator.input"] = "raw per-asset features (portfolio.asset_features), weights, mask"
        meta["allocator.postprocessing"] = SHARED_POSTPROCESSING
    else:
        meta["allocator.input"] = "raw observation (portfolio.build_raw_observation) and mask"
    return meta


def export_ensemble_policy(members: Sequence[LoadedRun], path: Path) -> Path:
    """Write the ensemble's ``model.onnx``, with a single model's inputs and outputs."""
    first = members[0]
    if first.shared:
        norms = []
        for m in members:
            assert m.feature_norm is not None
            norms.append(m.feature_norm)
        actors: list[torch.nn.Module] = [m.model.actor for m in members]
        graph = SharedEnsemblePolicyGraph(actors, norms, first.asset_spec.clip)
        return export_set_graph(graph, first, path, _metadata(members))
    flat = EnsemblePolicyGraph(
        [m.deterministic_actor() for m in members], first.spec, [m.stats for m in members]
    )
    flat_example = (torch.zeros(4, first.spec.obs_size), torch.ones(4, first.spec.n_slots))
    return export_graph(flat, flat_example, POLICY_INPUTS, POLICY_OUTPUTS, path, _metadata(members))


def _export_info(
    members: Sequence[LoadedRun],
    model_path: Path,
    parity: dict[str, Any],
    tolerance: float,
    name: str,
    version: str,
) -> dict[str, Any]:
    """The manifest's ``export`` section, as a single export's, with its members' sources."""
    shared = members[0].shared
    graph: dict[str, Any] = {"inputs": list(POLICY_INPUTS), "outputs": list(POLICY_OUTPUTS)}
    if shared:
        graph = {
            "inputs": list(SHARED_POLICY_INPUTS),
            "outputs": list(SHARED_POLICY_OUTPUTS),
            "asset_axis": "dynamic",
        }
    return {
        "action_mapping_in_graph": not shared,
        "postprocessing": SHARED_POSTPROCESSING if shared else "in the graph",
        "ensemble": f"{COMBINE}: the mean of {len(members)} members' deterministic actions",
        "curiosity": CURIOSITY_NOTE,
        "parity": {"tolerance": tolerance, "reference": "torch mean of the members", **parity},
        "opset": graph_opset(model_path),
        "exported_at": dt.datetime.now(dt.UTC).isoformat(),
        "source_runs": [str(m.run_dir.resolve()) for m in members],
        "registry_name": name,
        "registry_version": version,
        "graphs": {MODEL_FILE: graph},
        "library_versions": library_versions(),
    }


def ensemble_manifest(members: Sequence[LoadedRun], export: dict[str, Any], name: str) -> Manifest:
    """The first member's manifest as an ensemble's: its members listed, no curiosity, no
    single run's validation metrics; validated again (``model_copy`` would not)."""
    fields = {
        **members[0].manifest.model_dump(),
        "name": name,
        "schema_version": SCHEMA_VERSION,
        "export": export,
        "icm": None,
        "metrics": {},
        "ensemble": ensemble_info(members).model_dump(),
    }
    return Manifest.model_validate(fields)


def export_ensemble(
    run_dirs: Sequence[str | Path],
    registry: str | Path,
    name: str | None = None,
    version: str | None = None,
    *,
    tolerance: float = PARITY_TOLERANCE,
    n_parity: int = PARITY_SAMPLES,
    seed: int = 0,
) -> Path:
    """Export the runs as one ensemble version ``registry/NAME/VERSION`` and return it.

    NAME defaults to the first run's manifest name, VERSION to the next integer. Raises
    ``ExportError`` (writing nothing to the registry) when a run cannot be loaded, the runs
    differ in more than their seed, the version exists, or the graph and the torch mean of the
    members differ by more than ``tolerance``.
    """
    if len(run_dirs) < 2:
        raise ExportError(f"an ensemble needs at least 2 runs, got {len(run_dirs)}")
    members = [load_run(d) for d in run_dirs]
    check_members(members)
    name, model_dir, version = reserve_version(registry, name or members[0].manifest.name, version)
    with tempfile.TemporaryDirectory(prefix="allocator-ensemble-") as tmp:
        model_path = export_ensemble_policy(members, Path(tmp) / MODEL_FILE)
        parity = measure_ensemble_parity(members, model_path, n=n_parity, seed=seed)
        check_parity(parity, tolerance)
        info = _export_info(members, model_path, parity, tolerance, name, version)
        return publish([model_path], ensemble_manifest(members, info, name), model_dir, version)
