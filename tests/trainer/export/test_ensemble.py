"""Seed ensembles: k runs of one config, exported as one ONNX graph averaging their actions.

Members are the package's tiny runs (seed 0) and the same resolved config retrained with other
seeds. The references are rebuilt from each member's own torch model (SB3's ``predict``, or
``forward_sets`` at other universe sizes) on inputs normalized in numpy with its own statistics,
then averaged; never from the ensemble's export code.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from allocator.artifacts.manifest import (
    MANIFEST_FILE,
    EnsembleInfo,
    Manifest,
    checksums,
    read_manifest,
    read_raw,
    sha256_file,
    verify_checksums,
    write_manifest,
)
from allocator.cli import main
from allocator.portfolio import (
    FeatureSpec,
    action_to_weights,
    anchor_weights,
    asset_features,
    build_raw_observation,
    live_mask,
    normalize_features,
    normalize_observation,
    tilt_weights,
)
from allocator.registry.layout import ICM_FILE, MODEL_FILE
from allocator.serving import LoadedModel, load_model
from allocator.trainer.agents.algorithms import zero_actions
from allocator.trainer.export.errors import ExportError
from allocator.trainer.export.loaded_run import LoadedRun, load_run
from allocator.trainer.export.parity import (
    check_parity,
    onnx_session,
    random_raw_observations,
    random_set_observations,
    real_set_observations,
)
from allocator.trainer.export.run import export_runs
from allocator.trainer.training.config import load_config
from allocator.trainer.training.run import train
from allocator.trainer.training.run_dir import MODEL_FILE as RUN_MODEL_FILE
from tests.serving.conftest import decide_one, request_for
from tests.trainer.export import MAX_ASSETS, SHARED_MAX_ASSETS, TOL
from tests.trainer.export.conftest import SHARED_PARITY_SAMPLES

SIZES = (3, SHARED_MAX_ASSETS, 12)  # M / 2, M, 2M
FLAT_PARITY_SAMPLES = 300


def retrain(run: Path, seed: int, root: Path) -> Path:
    """The run's own resolved config, trained again with another seed."""
    config = load_config(run / "config.yaml", [f"seed={seed}"])
    return train(config, root / f"seed{seed}").run_dir


@pytest.fixture(scope="module")
def flat_members(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The package's tiny TD3 run (seed 0) and its config with seed 1."""
    return [runs["td3"], retrain(runs["td3"], 1, tmp_path_factory.mktemp("flat-seeds"))]


@pytest.fixture(scope="module")
def shared_members(
    shared_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> list[Path]:
    """The package's tiny shared TD3 run (seed 0) and its config with seeds 1 and 2."""
    root = tmp_path_factory.mktemp("shared-seeds")
    return [shared_runs["td3"], *(retrain(shared_runs["td3"], s, root) for s in (1, 2))]


@pytest.fixture(scope="module")
def flat_ensemble(flat_members: list[Path], registry: Path) -> Path:
    return export_runs(flat_members, registry, name="flat-ensemble", n_parity=FLAT_PARITY_SAMPLES)


@pytest.fixture(scope="module")
def shared_ensemble(shared_members: list[Path], registry: Path) -> Path:
    return export_runs(
        shared_members, registry, name="shared-ensemble", n_parity=SHARED_PARITY_SAMPLES
    )


@pytest.fixture(scope="module")
def loaded_flat(flat_members: list[Path]) -> list[LoadedRun]:
    return [load_run(d) for d in flat_members]


@pytest.fixture(scope="module")
def loaded_shared(shared_members: list[Path]) -> list[LoadedRun]:
    return [load_run(d) for d in shared_members]


def flat_mean_action(members: list[LoadedRun], raw: np.ndarray) -> np.ndarray:
    """Each member's SB3 ``predict`` on the raw observation normalized with its statistics."""
    actions = [
        m.model.predict(normalize_observation(raw, m.spec, m.stats), deterministic=True)[0]
        for m in members
    ]
    return np.mean(np.stack(actions).astype(np.float64), axis=0)


def shared_mean_action(
    members: list[LoadedRun], raw: np.ndarray, weights: np.ndarray, mask: np.ndarray
) -> np.ndarray:
    """Each member's ``forward_sets`` on raw features (B, N, F) normalized with its statistics."""
    live = live_mask(mask)
    actions = []
    for m in members:
        assert m.feature_norm is not None
        z = normalize_features(raw, m.feature_norm, m.asset_spec.clip, live)
        with torch.no_grad():
            a = m.model.actor.forward_sets(
                torch.as_tensor(z),
                torch.as_tensor(weights),
                torch.as_tensor(live, dtype=torch.float32),
            )
        actions.append(a.numpy())
    return np.mean(np.stack(actions).astype(np.float64), axis=0)


# --- the manifest --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["flat", "shared"])
def test_manifest_lists_the_members_and_has_no_curiosity(
    kind: str, request: pytest.FixtureRequest
) -> None:
    out: Path = request.getfixturevalue(f"{kind}_ensemble")
    members: list[Path] = request.getfixturevalue(f"{kind}_members")
    manifest = read_manifest(out)
    verify_checksums(out, manifest)
    assert manifest.ensemble is not None
    assert manifest.ensemble.combine == "mean_action"
    listed = manifest.ensemble.members
    assert [m.seed for m in listed] == list(range(len(members)))
    assert [m.run_dir for m in listed] == [str(d.resolve()) for d in members]
    assert [m.run_id for m in listed] == [d.resolve().name for d in members]
    assert [m.model_sha256 for m in listed] == [sha256_file(d / "model.zip") for d in members]
    for entry, run in zip(listed, members, strict=True):
        source = read_manifest(run)
        assert entry.normalization == source.normalization
        assert entry.feature_normalization == source.feature_normalization
    first = read_manifest(members[0])
    assert manifest.feature_spec == first.feature_spec
    assert manifest.policy == first.policy
    assert manifest.tilt == first.tilt
    assert manifest.icm is None
    assert sorted(manifest.files) == [MODEL_FILE]
    assert not (out / ICM_FILE).exists()
    assert manifest.export["curiosity"].startswith("none")
    assert manifest.export["source_runs"] == [str(d.resolve()) for d in members]


def test_members_trained_with_curiosity_give_an_ensemble_without_it(
    runs: dict[str, Path], registry: Path, tmp_path: Path
) -> None:
    """SAC members (squashed-Gaussian mode as the action) with curiosity: no icm.onnx, the
    manifest says why, and the server loads it without a curiosity session."""
    members = [runs["sac"], retrain(runs["sac"], 1, tmp_path)]
    out = export_runs(members, registry, name="sac-ensemble", n_parity=200)
    manifest = read_manifest(out)
    assert manifest.ensemble is not None
    assert [m.icm for m in manifest.ensemble.members] == [True, True]
    assert manifest.icm is None
    assert sorted(manifest.files) == [MODEL_FILE]
    check_parity(manifest.export["parity"], TOL)
    loaded = [load_run(d) for d in members]
    raw, masks = random_raw_observations(loaded[0].spec, 200, np.random.default_rng(4))
    action, _ = onnx_session(out / MODEL_FILE).run(None, {"observation": raw, "mask": masks})
    assert np.max(np.abs(action - flat_mean_action(loaded, raw))) <= TOL
    assert load_model(out, prefer_cuda=False).icm_session is None


def test_a_single_models_manifest_has_no_ensemble_field(exported: dict[str, Path]) -> None:
    assert "ensemble" not in read_raw(exported["td3"])
    assert read_manifest(exported["td3"]).ensemble is None


def test_ensemble_field_needs_two_members_and_no_icm(flat_ensemble: Path) -> None:
    raw = read_raw(flat_ensemble)
    one = {**raw, "ensemble": {**raw["ensemble"], "members": raw["ensemble"]["members"][:1]}}
    with pytest.raises(ValueError, match="at least 2"):
        Manifest.model_validate(one)
    with pytest.raises(ValueError, match="no curiosity"):
        Manifest.model_validate({**raw, "icm": {"enabled": True}})
    assert isinstance(Manifest.model_validate(raw).ensemble, EnsembleInfo)


# --- parity with the torch mean ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["flat", "shared"])
def test_recorded_parity_is_within_tolerance_and_members_differ(
    kind: str, request: pytest.FixtureRequest
) -> None:
    info = read_manifest(request.getfixturevalue(f"{kind}_ensemble")).export
    parity = info["parity"]
    check_parity(parity, TOL)
    if kind == "flat":
        assert parity["random"]["n"] == parity["real"]["n"] == FLAT_PARITY_SAMPLES
        spreads = [parity["random"]["member_spread"], parity["real"]["member_spread"]]
    else:
        assert sorted(parity["random"]) == sorted(f"n{s}" for s in SIZES)
        assert {"rollout", *(f"n{s}" for s in SIZES)} == set(parity["real"])
        spreads = [parity[p][f"n{s}"]["member_spread"] for p in ("random", "real") for s in SIZES]
    assert min(spreads) > 1e-3  # the members really differ: averaging is tested, not a copy


def test_flat_graph_is_the_mean_of_the_members_actions(
    flat_ensemble: Path, loaded_flat: list[LoadedRun]
) -> None:
    spec = loaded_flat[0].spec
    raw, masks = random_raw_observations(spec, 400, np.random.default_rng(17))
    action, weights = onnx_session(flat_ensemble / MODEL_FILE).run(
        None, {"observation": raw, "mask": masks}
    )
    want = flat_mean_action(loaded_flat, raw)
    assert np.max(np.abs(action - want)) <= TOL
    np.testing.assert_allclose(weights, action_to_weights(action, masks), atol=TOL)
    single = [flat_mean_action([m, m], raw) for m in loaded_flat]
    assert min(np.max(np.abs(s - want)) for s in single) > 1e-3  # not one member's action


def restated_copy(run: Path, root: Path) -> Path:
    """A copy of a shared run whose per-asset statistics are other ones (std x 1.5, mean
    shifted), its files and manifest consistent: a member fitted differently."""
    out = root / "restated"
    shutil.copytree(run, out)
    path = out / "feature_normalization.json"
    saved = json.loads(path.read_text())
    mean, std = np.asarray(saved["mean"]), np.asarray(saved["std"])
    saved.update(mean=list(mean + 0.2 * std), std=list(1.5 * std))
    path.write_text(json.dumps(saved))
    manifest = read_manifest(out)
    norm = {"mean": saved["mean"], "std": saved["std"]}
    files = checksums(out, list(manifest.files))
    fields = {**manifest.model_dump(), "feature_normalization": norm, "files": files}
    write_manifest(out, Manifest.model_validate(fields))
    return out


def test_each_member_is_normalized_with_its_own_statistics(
    shared_members: list[Path], loaded_shared: list[LoadedRun], registry: Path, tmp_path: Path
) -> None:
    other = restated_copy(shared_members[1], tmp_path)
    out = export_runs([shared_members[0], other], registry, name="own-stats", n_parity=50)
    members = [loaded_shared[0], load_run(other)]
    listed = read_manifest(out).ensemble
    assert listed is not None
    assert listed.members[1].feature_normalization == read_manifest(other).feature_normalization
    assert listed.members[0].feature_normalization != listed.members[1].feature_normalization
    obs = random_set_observations(members[0], 200, 8, np.random.default_rng(8))
    (action,) = onnx_session(out / MODEL_FILE).run(None, obs.feeds())
    want = shared_mean_action(members, obs.features, obs.weights, obs.masks)
    assert np.max(np.abs(action - want)) <= TOL
    stale = shared_mean_action(loaded_shared[:2], obs.features, obs.weights, obs.masks)
    assert np.max(np.abs(action - stale)) > 1e-3  # the restated statistics are the ones applied


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("source", ["random", "real"])
def test_shared_graph_is_the_mean_of_the_members_actions_at_any_size(
    shared_ensemble: Path, loaded_shared: list[LoadedRun], size: int, source: str
) -> None:
    rng = np.random.default_rng(size)
    first = loaded_shared[0]
    make = random_set_observations if source == "random" else real_set_observations
    obs = make(first, 150, size, rng)
    (action,) = onnx_session(shared_ensemble / MODEL_FILE).run(None, obs.feeds())
    want = shared_mean_action(loaded_shared, obs.features, obs.weights, obs.masks)
    assert action.shape == (150, size + 1)
    assert np.max(np.abs(action - want)) <= TOL
    assert np.all(action[~live_mask(obs.masks)] == 0.0)


def test_permuting_the_assets_permutes_the_ensembles_action(
    shared_ensemble: Path, loaded_shared: list[LoadedRun]
) -> None:
    obs = random_set_observations(loaded_shared[0], 50, 9, np.random.default_rng(5))
    session = onnx_session(shared_ensemble / MODEL_FILE)
    (action,) = session.run(None, obs.feeds())
    perm = np.random.default_rng(6).permutation(9)
    slots = np.concatenate([[0], perm + 1])
    feeds = {
        "asset_features": obs.features[:, perm],
        "weights": obs.weights[:, slots],
        "mask": obs.masks[:, slots],
    }
    (permuted,) = session.run(None, feeds)
    np.testing.assert_allclose(permuted, action[:, slots], atol=1e-6)


# --- served like any model -----------------------------------------------------------------


def closes(n: int, length: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    steps = rng.normal(0.0, 0.02, (n, length)) + rng.normal(0.0, 0.01, (n, 1))
    return 30.0 * rng.uniform(1, 3, (n, 1)) * np.exp(np.cumsum(steps, axis=1))


@pytest.mark.parametrize("n", SIZES)
def test_shared_ensemble_is_served_as_the_tilt_of_the_mean_action(
    shared_ensemble: Path, loaded_shared: list[LoadedRun], n: int
) -> None:
    model: LoadedModel = load_model(shared_ensemble, prefer_cuda=False)
    policy = model.set_policy
    assert policy is not None
    assert model.icm_session is None
    prices = closes(n, model.prices_per_asset, seed=n)
    current = np.random.default_rng(n).dirichlet(np.ones(n + 1))
    ids = [f"A{i}" for i in range(n)]
    out, _ = decide_one(model, request_for(model, ids, prices, current), None)
    mask = np.ones(n + 1, dtype=bool)
    raw = asset_features(prices, mask, policy.features)[None].astype(np.float32)
    action = shared_mean_action(
        loaded_shared, raw, current[None].astype(np.float32), mask[None].astype(np.float32)
    )[0]
    manifest = read_manifest(loaded_shared[0].run_dir)
    assert manifest.tilt is not None
    anchor = anchor_weights(prices, mask, manifest.tilt.anchor.spec())
    want = tilt_weights(action, anchor, mask, manifest.tilt.k)
    np.testing.assert_allclose(out.raw_weights, want, atol=1e-6)
    for member in loaded_shared:  # the mean's tilt, which is no single member's
        alone = shared_mean_action([member], raw, current[None].astype(np.float32), mask[None])
        single = tilt_weights(alone[0], anchor, mask, manifest.tilt.k)
        assert np.max(np.abs(out.raw_weights - single)) > 2e-5


def test_flat_ensemble_is_served_as_the_weights_of_the_mean_action(
    flat_ensemble: Path, loaded_flat: list[LoadedRun]
) -> None:
    model = load_model(flat_ensemble, prefer_cuda=False)
    assert model.set_policy is None
    assert model.icm_session is None
    fs = model.manifest.feature_spec
    spec = FeatureSpec(max_assets=fs.max_assets, window=fs.window, clip=fs.clip)
    prices = closes(MAX_ASSETS, model.prices_per_asset, seed=3)
    current = np.random.default_rng(3).dirichlet(np.ones(MAX_ASSETS + 1))
    ids = [f"A{i}" for i in range(MAX_ASSETS)]
    out, _ = decide_one(model, request_for(model, ids, prices, current), None)
    mask = np.ones(MAX_ASSETS + 1, dtype=bool)
    raw = build_raw_observation(prices, current, mask, spec)[None]
    action = flat_mean_action(loaded_flat, raw)
    want = action_to_weights(action, mask[None])[0]
    np.testing.assert_allclose(out.raw_weights, want, atol=1e-6)


# --- refusals ------------------------------------------------------------------------------


def versions(registry: Path) -> set[str]:
    return {str(p.relative_to(registry)) for p in registry.glob("*/*") if p.is_dir()}


def edited_copy(run: Path, root: Path, name: str, **changes: Any) -> Path:
    """A copy of the run whose manifest says something else (the model itself unchanged)."""
    out = root / name
    shutil.copytree(run, out)
    manifest = read_manifest(out)
    write_manifest(out, Manifest.model_validate({**manifest.model_dump(), **changes}))
    return out


def shared_changes(run: Path) -> dict[str, dict[str, Any]]:
    m = read_manifest(run)
    assert m.tilt is not None
    tilt = m.tilt.model_dump()
    return {
        "tilt": {"tilt": {**tilt, "k": 1.0}},
        "anchor": {"tilt": {**tilt, "anchor": {**tilt["anchor"], "kind": "equal"}}},
        "beta": {"beta": 0.3},
        "data": {"data": {**m.data.model_dump(), "train_end": "2019-12-30"}},
        "max_served_assets": {"max_served_assets": 32},
    }


@pytest.mark.parametrize("key", ["tilt", "anchor", "beta", "data", "max_served_assets"])
def test_members_differing_in_more_than_the_seed_are_refused(
    shared_members: list[Path], registry: Path, tmp_path: Path, key: str
) -> None:
    changes = shared_changes(shared_members[1])[key]
    other = edited_copy(shared_members[1], tmp_path, f"changed-{key}", **changes)
    before = versions(registry)
    field = "tilt" if key == "anchor" else key
    with pytest.raises(ExportError, match=rf"{field} is .*only in their seed") as err:
        export_runs([shared_members[0], other], registry, name="refused")
    assert str(other) in str(err.value)
    assert versions(registry) == before


def test_other_representation_or_algorithm_is_refused(
    runs: dict[str, Path], shared_runs: dict[str, Path], registry: Path
) -> None:
    before = versions(registry)
    with pytest.raises(ExportError, match="only in their seed"):
        export_runs([runs["td3"], shared_runs["td3"]], registry, name="refused")
    with pytest.raises(ExportError, match=r"algorithm is 'sac', but .* has 'td3'"):
        export_runs([runs["td3"], runs["sac"]], registry, name="refused")
    assert versions(registry) == before


def test_the_same_model_twice_or_the_same_seed_is_refused(
    flat_members: list[Path], registry: Path, tmp_path: Path
) -> None:
    first, second = flat_members
    with pytest.raises(ExportError, match=r"the same model\.zip"):
        export_runs([first, first], registry, name="refused")
    relabelled = edited_copy(second, tmp_path, "relabelled", seed=7)
    with pytest.raises(ExportError, match=r"the same model\.zip"):
        export_runs([second, relabelled], registry, name="refused")
    same_seed = edited_copy(second, tmp_path, "same-seed", seed=0)
    with pytest.raises(ExportError, match="seed 0, as"):
        export_runs([first, same_seed], registry, name="refused")
    with pytest.raises(ExportError, match="no run directory given"):
        export_runs([], registry, name="refused")
    assert not (registry / "refused").exists()


def test_cli_exports_several_runs_as_an_ensemble(
    flat_members: list[Path], runs: dict[str, Path], tmp_path: Path
) -> None:
    registry = tmp_path / "models"
    cli = CliRunner()
    args = ["export", *map(str, flat_members), "--registry", str(registry), "--name", "ens"]
    result = cli.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "ensemble of 2 runs (seeds 0, 1)" in result.output
    manifest = json.loads((registry / "ens" / "1" / MANIFEST_FILE).read_text())
    assert len(manifest["ensemble"]["members"]) == 2
    refused = cli.invoke(
        main, ["export", str(runs["td3"]), str(runs["sac"]), "--registry", str(registry)]
    )
    assert refused.exit_code != 0
    assert "only in their seed" in refused.output


def anchored_copy(run: Path, root: Path) -> Path:
    """A copy of a run as selection leaves one that kept the zero action: its actor's heads
    zeroed, ``holds_anchor`` in its manifest, its checksums consistent."""
    out = root / f"anchored-{run.name}"
    shutil.copytree(run, out)
    loaded = load_run(out)
    zero_actions(loaded.model.actor)
    loaded.model.save(out / RUN_MODEL_FILE)
    manifest = read_manifest(out)
    files = checksums(out, list(manifest.files))
    write_manifest(out, manifest.model_copy(update={"holds_anchor": True, "files": files}))
    return out


def test_an_ensemble_holds_its_anchor_only_when_every_member_does(
    flat_members: list[Path], registry: Path, tmp_path: Path
) -> None:
    anchored = [anchored_copy(m, tmp_path) for m in flat_members[:2]]
    both = export_runs(anchored, registry, name="both-anchored", n_parity=50)
    assert read_manifest(both).holds_anchor
    raw, masks = random_raw_observations(load_run(anchored[0]).spec, 50, np.random.default_rng(3))
    action, _ = onnx_session(both / MODEL_FILE).run(None, {"observation": raw, "mask": masks})
    assert not action.any()  # what the manifest claims: exactly the zero action
    one = export_runs([anchored[0], flat_members[1]], registry, name="one-anchored", n_parity=50)
    assert not read_manifest(one).holds_anchor
