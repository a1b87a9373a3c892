"""Exporting a shared (per-asset) policy: the manifest it publishes, a graph with a dynamic asset
axis, parity with torch at three universe sizes, permutation equivariance, and refusals."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
import torch

from allocator.artifacts.manifest import (
    DEFAULT_MAX_SERVED_ASSETS,
    MANIFEST_FILE,
    SCHEMA_VERSION,
    TILT_MAPPING,
    read_manifest,
    verify_checksums,
)
from allocator.portfolio import (
    FeatureNormalization,
    asset_features,
    live_mask,
    normalize_features,
)
from allocator.registry.layout import (
    ICM_FILE,
    ICM_INPUTS,
    MODEL_FILE,
    SHARED_POLICY_INPUTS,
    SHARED_POLICY_OUTPUTS,
)
from allocator.trainer.checkpoints.errors import CheckpointUpgradeError
from allocator.trainer.checkpoints.manifest import describe
from allocator.trainer.checkpoints.upgrade import upgrade_run
from allocator.trainer.checkpoints.widening import widen
from allocator.trainer.export.errors import ExportError
from allocator.trainer.export.graphs import FeatureNormalizer
from allocator.trainer.export.loaded_run import load_run
from allocator.trainer.export.parity import (
    SetObservations,
    onnx_session,
    parity_sizes,
    policy_parity,
    random_set_observations,
    real_set_observations,
)
from allocator.trainer.export.run import check_exportable, export_run
from allocator.trainer.training.config import load_config
from tests.trainer.export import SHARED_MAX_ASSETS, TOL

SIZES = (3, 6, 12)  # M / 2, M, 2M


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_published_manifest_says_shared_with_its_limit_and_tilt(shared_exported, shared_runs, algo):
    out = shared_exported[algo]
    manifest, source = read_manifest(out), read_manifest(shared_runs[algo])
    config = load_config(shared_runs[algo] / "config.yaml")
    verify_checksums(out, manifest)
    assert manifest.schema_version == SCHEMA_VERSION
    assert manifest.policy.kind == "shared"
    assert manifest.policy.hidden == 16
    assert manifest.policy.center_assets == (algo == "sac") == config.shared.center_assets
    assert manifest.max_served_assets == DEFAULT_MAX_SERVED_ASSETS
    assert manifest.served_asset_limit == DEFAULT_MAX_SERVED_ASSETS
    assert manifest.action_mapping == TILT_MAPPING
    assert manifest.tilt is not None
    assert manifest.tilt.k == config.env.action.k == 2.0
    assert manifest.tilt.anchor.spec() == config.env.action.anchor.spec
    assert manifest.feature_spec.asset_spec() == config.env.asset_feature_spec
    assert manifest.feature_spec.max_assets == SHARED_MAX_ASSETS
    saved = json.loads((shared_runs[algo] / "feature_normalization.json").read_text())
    assert manifest.feature_normalization is not None
    assert manifest.feature_normalization.normalization() == FeatureNormalization.from_dict(saved)
    assert manifest.feature_normalization == source.feature_normalization
    info = manifest.export
    assert info["action_mapping_in_graph"] is False
    assert "portfolio.tilt_weights" in info["postprocessing"]
    assert "portfolio.anchor_weights" in info["postprocessing"]
    assert info["graphs"][MODEL_FILE] == {
        "inputs": list(SHARED_POLICY_INPUTS),
        "outputs": list(SHARED_POLICY_OUTPUTS),
        "asset_axis": "dynamic",
    }
    assert (ICM_FILE in manifest.files) == (algo == "sac")
    if algo == "sac":
        assert info["graphs"][ICM_FILE]["inputs"] == list(ICM_INPUTS)


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_recorded_parity_covers_three_sizes_random_and_real(shared_exported, algo):
    parity = read_manifest(shared_exported[algo]).export["parity"]
    assert parity_sizes(SHARED_MAX_ASSETS) == SIZES
    for kind in ("random", "real"):
        for size in SIZES:
            entry = parity[kind][f"n{size}"]
            assert entry["assets"] == size
            assert entry["n"] == 200
            assert entry["max_abs_action_diff"] <= TOL
            assert entry["max_abs_masked_action"] == 0.0
    rollout = parity["real"]["rollout"]
    assert rollout["assets"] == SHARED_MAX_ASSETS
    assert rollout["max_abs_observation_diff"] <= TOL  # asset_features == the environment's
    assert rollout["max_abs_flat_action_diff"] <= TOL  # forward_sets == the trained actor
    if algo == "sac":
        assert parity["icm"]["random"]["max_abs_reward_diff"] <= TOL
        assert parity["icm"]["real"]["max_abs_reward_diff"] <= TOL


def test_graph_signature_has_dynamic_batch_and_asset_axes(shared_exported, shared_runs):
    model = onnx.load(str(shared_exported["td3"] / MODEL_FILE))
    f = load_run(shared_runs["td3"]).spec.window

    def dims(values):
        return {
            v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in values
        }

    inputs, outputs = dims(model.graph.input), dims(model.graph.output)
    assert list(inputs) == list(SHARED_POLICY_INPUTS)
    assert list(outputs) == list(SHARED_POLICY_OUTPUTS)
    batch, assets = inputs["asset_features"][:2]
    assert isinstance(batch, str)
    assert isinstance(assets, str)
    assert inputs["asset_features"][2] == f
    slots = inputs["weights"][1]
    assert isinstance(slots, str)
    assert slots != assets
    assert inputs["mask"] == inputs["weights"] == outputs["action"] == [batch, slots]
    props = {p.key: p.value for p in model.metadata_props}
    assert props["allocator.policy"] == "shared"
    assert props["allocator.action_mapping"] == TILT_MAPPING


@pytest.mark.parametrize("algo", ["td3", "sac"])
@pytest.mark.parametrize("size", SIZES)
def test_onnx_matches_torch_at_each_universe_size(shared_exported, shared_runs, algo, size):
    loaded = load_run(shared_runs[algo])
    session = onnx_session(shared_exported[algo] / MODEL_FILE)
    rng = np.random.default_rng(100 + size)
    for make in (random_set_observations, real_set_observations):
        obs = make(loaded, 300, size, rng)
        parity = policy_parity(session, [loaded], obs)
        assert parity["max_abs_action_diff"] <= TOL, (make.__name__, parity)
        assert parity["max_abs_masked_action"] == 0.0
        (action,) = session.run(None, obs.feeds())
        assert action.shape == (300, size + 1)
        assert np.all(np.abs(action) <= 1.0)


@pytest.mark.parametrize("algo", ["td3", "sac"])
@pytest.mark.parametrize("size", SIZES)
def test_permuting_live_assets_permutes_the_onnx_action(shared_exported, shared_runs, size, algo):
    """Prices permuted -> features (contract), then the graph's action, permuted exactly
    (SAC's graph centres its asset scores, TD3's does not)."""
    loaded = load_run(shared_runs[algo])
    session = onnx_session(shared_exported[algo] / MODEL_FILE)
    rng = np.random.default_rng(size)
    n, p = 100, loaded.asset_spec.prices_per_asset
    steps = rng.normal(0.0, 0.02, size=(n, size, p - 1))
    prices = 50.0 * np.exp(np.concatenate([np.zeros((n, size, 1)), np.cumsum(steps, -1)], -1))
    mask = np.ones((n, size + 1), np.float32)
    mask[:, 1:] = rng.random((n, size)) < 0.7
    weights = rng.dirichlet(np.ones(size + 1), size=n).astype(np.float32) * mask
    weights /= weights.sum(axis=1, keepdims=True)
    perm = rng.permutation(size)
    slots = np.concatenate([[0], 1 + perm])

    def act(px, w, m):
        feats = asset_features(px, m, loaded.asset_spec).astype(np.float32)
        return session.run(None, SetObservations(feats, w, m).feeds())[0]

    base = act(prices, weights, mask)
    permuted = act(prices[:, perm], weights[:, slots], mask[:, slots])
    np.testing.assert_allclose(permuted, base[:, slots], rtol=0, atol=0)
    assert not np.array_equal(base[:, 1:], base[:, slots][:, 1:])  # the permutation moved things


def test_masked_rows_and_mask_values_do_not_matter(shared_exported, shared_runs):
    loaded = load_run(shared_runs["td3"])
    session = onnx_session(shared_exported["td3"] / MODEL_FILE)
    obs = random_set_observations(loaded, 200, 12, np.random.default_rng(5))
    (base,) = session.run(None, obs.feeds())
    masked = obs.masks[:, 1:] == 0
    features = obs.features.copy()
    features[masked] = np.float32(np.nan)
    scaled_mask = obs.masks * np.float32(3.0)  # any non-zero entry is live, as live_mask says
    (again,) = session.run(None, SetObservations(features, obs.weights, scaled_mask).feeds())
    np.testing.assert_array_equal(again, base)


def test_feature_normalizer_is_bit_exact_with_numpy(shared_runs):
    loaded = load_run(shared_runs["td3"])
    assert loaded.feature_norm is not None
    obs = random_set_observations(loaded, 300, 9, np.random.default_rng(7))
    live = live_mask(obs.masks)
    ours = FeatureNormalizer(loaded.feature_norm, loaded.asset_spec.clip)(
        torch.as_tensor(obs.features), torch.as_tensor(live[:, 1:])
    ).numpy()
    numpy = normalize_features(obs.features, loaded.feature_norm, loaded.asset_spec.clip, live)
    assert np.array_equal(ours, numpy)
    assert np.any(np.abs(numpy) == loaded.asset_spec.clip)  # the clip was exercised


def test_export_refuses_representations_no_graph_serves(shared_runs):
    manifest = read_manifest(shared_runs["td3"])
    check_exportable(manifest, shared_runs["td3"])
    affine = manifest.model_copy(update={"action_mapping": "affine_renormalize_v1", "tilt": None})
    with pytest.raises(ExportError, match="shared policy with feature set asset_v1 and mapping a"):
        check_exportable(affine, shared_runs["td3"])
    mlp = manifest.policy.model_copy(update={"kind": "mlp"})
    flat = manifest.model_copy(update={"policy": mlp})
    with pytest.raises(ExportError, match="mlp policies are served with return-window features"):
        check_exportable(flat, shared_runs["td3"])


def test_an_altered_feature_normalization_is_refused(shared_runs, tmp_path):
    run = shutil.copytree(shared_runs["td3"], tmp_path / "run")
    raw = json.loads((run / MANIFEST_FILE).read_text())
    raw["feature_normalization"]["std"][0] *= 2
    (run / MANIFEST_FILE).write_text(json.dumps(raw))
    with pytest.raises(ExportError, match=r"feature_normalization differs.*altered"):
        export_run(run, tmp_path / "registry")
    assert not (tmp_path / "registry").exists()


def test_a_schema_2_shared_run_is_refused_until_migrated(shared_runs, tmp_path):
    """A shared run whose manifest predates schema 3 reads as a flat MLP: export refuses it
    (the model disagrees), and after ``checkpoint migrate`` it exports as shared."""
    run = shutil.copytree(shared_runs["td3"], tmp_path / "run")
    raw = json.loads((run / MANIFEST_FILE).read_text())
    for key in ("policy", "feature_normalization", "tilt", "max_served_assets"):
        del raw[key]
    fs = raw["feature_spec"]
    raw["feature_spec"] = {k: fs[k] for k in ("max_assets", "window", "clip")}
    raw["action_mapping"] = "affine_renormalize_v1"
    raw["schema_version"] = 2
    (run / MANIFEST_FILE).write_text(json.dumps(raw))
    registry = tmp_path / "registry"
    with pytest.raises(ExportError, match="a shared policy, but the manifest says policy 'mlp'"):
        export_run(run, registry)
    result = upgrade_run(run)
    assert (result.from_version, result.to_version) == (2, 3)
    assert result.probe.float32_max_diff == 0.0
    migrated = read_manifest(run)
    assert migrated.policy.kind == "shared"
    assert migrated.tilt == read_manifest(shared_runs["td3"]).tilt
    assert migrated.feature_spec == read_manifest(shared_runs["td3"]).feature_spec
    assert migrated.migrations[-1].note.startswith("policy, feature set and action mapping")
    out = export_run(run, registry, n_parity=50)
    assert read_manifest(out).policy.kind == "shared"


def test_a_shared_run_is_never_widened_and_nothing_is_touched(shared_runs, tmp_path):
    run = shutil.copytree(shared_runs["td3"], tmp_path / "run")
    with pytest.raises(CheckpointUpgradeError, match="a shared policy is never widened"):
        upgrade_run(run, max_assets=SHARED_MAX_ASSETS + 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no backup was made
    with pytest.raises(CheckpointUpgradeError, match="cannot widen a shared policy"):
        widen(run, SHARED_MAX_ASSETS + 2, "now")
    assert read_manifest(run) == read_manifest(shared_runs["td3"])


def test_inspect_describes_the_representation(shared_exported):
    text = describe(read_manifest(shared_exported["sac"]))
    assert f"policy          shared (hidden 16), serves up to {DEFAULT_MAX_SERVED_ASSETS}" in text
    assert "feature set     asset_v1 v1, horizons [5, 10], vol_window 10" in text
    assert "action mapping  anchor_tilt_v1 (k 2.0, anchor inverse_volatility" in text
