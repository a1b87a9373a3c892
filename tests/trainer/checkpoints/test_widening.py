"""Widening a checkpoint to more asset slots: every old action kept exactly, new slots inert,
training resumable; and why the identity is checked in canonical float64.

Every test widens a copy in tmp_path; the fixtures themselves are never touched.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from allocator.artifacts.manifest import SCHEMA_VERSION, read_manifest, verify_checksums
from allocator.portfolio import FeatureSpec, action_to_weights
from allocator.trainer.agents.icm import IntrinsicCuriosity
from allocator.trainer.checkpoints import widening
from allocator.trainer.checkpoints.errors import CheckpointUpgradeError
from allocator.trainer.checkpoints.probes import (
    FLOAT32_ATOL,
    ProbeParts,
    actor_layers,
    canonical_forward,
    canonical_linear,
    load_model,
    probe_masks,
    probe_parts,
)
from allocator.trainer.checkpoints.upgrade import upgrade_run
from allocator.trainer.checkpoints.widening import Embedding, observation_embedding
from allocator.trainer.sim.env import EnvConfig, PortfolioEnv
from tests.markets import random_walk_market
from tests.trainer.checkpoints.runs import ALGO, FIXTURES, SAC, TD3, WIDTH, copy_fixture, tree

# --- widening ---------------------------------------------------------------------------------


def old_slot_observations(spec: FeatureSpec, per_mask: int = 8) -> ProbeParts:
    """Observations for every subset of live old slots."""
    live = np.array(list(itertools.product([0.0, 1.0], repeat=spec.max_assets)), np.float32)
    masks = np.concatenate([np.ones((len(live), 1), np.float32), live], axis=1)
    assert np.array_equal(masks, probe_masks(spec.max_assets))
    return probe_parts(spec, masks, per_mask, seed=123)


@pytest.mark.parametrize(("name", "extra"), [(TD3, 1), (SAC, 2)])
def test_widening_keeps_every_old_action_exactly(tmp_path, name, extra):
    run_dir = copy_fixture(tmp_path, name)
    upgrade_run(run_dir)
    old_m = WIDTH[name]
    new_m = old_m + extra
    result = upgrade_run(run_dir, max_assets=new_m)
    assert result.widened_from == old_m
    assert result.probe.canonical_max_diff == 0.0
    assert result.probe.critic_canonical_max_diff == 0.0
    assert result.probe.new_slot_max_action == 0.0
    assert result.probe.masks == 2**old_m
    if name == SAC:
        assert result.probe.icm_canonical_max_diff == 0.0

    manifest = read_manifest(run_dir)
    verify_checksums(run_dir, manifest)
    assert manifest.widened_from == old_m
    assert manifest.feature_spec.max_assets == new_m
    assert manifest.migrations[-1].note.startswith(f"widened max_assets {old_m} -> {new_m}")
    assert len(manifest.migrations) == 3  # 1 -> 2, 2 -> 3, then the widening

    # Independently of the migration's own check: every mask over the old slots, new ones masked.
    spec = FeatureSpec(old_m, window=3)
    new_spec = FeatureSpec(new_m, window=3)
    parts = old_slot_observations(spec)
    obs_old, obs_new = parts.observations(spec), parts.observations(new_spec)
    assert not obs_new[:, new_spec.obs_size - (new_m - old_m) :].any()  # new slots masked
    old = load_model(ALGO[name], FIXTURES / name / "model.zip")
    new = load_model(ALGO[name], run_dir / "model.zip")
    assert new.observation_space.shape == (new_spec.obs_size,)
    assert new.action_space.shape == (new_m + 1,)
    old_actor = actor_layers(old)["actor"]
    new_actor = actor_layers(new)["actor"]
    a_old = canonical_forward(old_actor, obs_old)
    a_new = canonical_forward(new_actor, obs_new)
    assert np.array_equal(a_new[:, : old_m + 1], a_old)  # difference exactly 0
    assert not a_new[:, old_m + 1 :].any()  # new slots act 0 (tanh of a zero row)
    w_old = action_to_weights(a_old, parts.mask)
    w_new = action_to_weights(a_new, obs_new[:, -(new_m + 1) :])
    assert np.array_equal(w_new[:, : old_m + 1], w_old)
    assert not w_new[:, old_m + 1 :].any()  # masked new slots hold nothing
    # The float32 models as deployed: the same up to BLAS summation order (reported, bounded).
    f_old = old.predict(obs_old, deterministic=True)[0]
    f_new = new.predict(obs_new, deterministic=True)[0]
    assert np.max(np.abs(f_new[:, : old_m + 1] - f_old)) <= FLOAT32_ATOL


def test_widened_first_layer_has_zero_columns_at_the_new_slots(tmp_path):
    run_dir = copy_fixture(tmp_path, TD3)
    upgrade_run(run_dir, max_assets=4)  # version 1 straight to a widened current version
    old = load_model("td3", FIXTURES / TD3 / "model.zip").policy
    new = load_model("td3", run_dir / "model.zip").policy
    emb = observation_embedding(FeatureSpec(2, window=3), 4)
    new_cols = np.setdiff1d(np.arange(emb.size), emb.index)
    for net in ("actor", "actor_target"):
        w_old = getattr(old, net).mu[0].weight.detach()
        w_new = getattr(new, net).mu[0].weight.detach()
        assert torch.equal(w_new[:, emb.index], w_old)
        assert not w_new[:, new_cols].any()
        last_old, last_new = getattr(old, net).mu[-2], getattr(new, net).mu[-2]
        assert torch.equal(last_new.weight[:3], last_old.weight)
        assert not last_new.weight[3:].any()
        assert not last_new.bias[3:].any()
    q_old, q_new = old.critic.qf0[0].weight.detach(), new.critic.qf0[0].weight.detach()
    assert torch.equal(q_new[:, np.concatenate([emb.index, emb.size + np.arange(3)])], q_old)
    assert not q_new[:, emb.size + 3 :].any()  # the new action slots
    manifest = read_manifest(run_dir)
    versions = [(r.from_version, r.to_version) for r in manifest.migrations]
    assert versions == [(1, 2), (2, 3), (3, 3)]
    assert manifest.widened_from == 2


def test_widened_models_load_and_keep_training(tmp_path):
    """Optimizer moments, action noise and spaces fit the new shapes: gradient steps run."""
    td3_dir, sac_dir = copy_fixture(tmp_path, TD3), copy_fixture(tmp_path, SAC)
    upgrade_run(td3_dir, max_assets=3)
    upgrade_run(sac_dir, max_assets=4)
    market = random_walk_market()
    for run_dir, algo, width in ((td3_dir, "td3", 3), (sac_dir, "sac", 4)):
        model = load_model(algo, run_dir / "model.zip")
        model.set_env(
            PortfolioEnv(market, EnvConfig(max_assets=width, window=3, episode_length=20))
        )
        updates = model._n_updates
        model.learn(80)  # learning_starts 50
        assert model._n_updates > updates
    td3 = load_model("td3", td3_dir / "model.zip")
    assert td3.action_noise is not None
    assert td3.action_noise._sigma.shape == (4,)
    sac = load_model("sac", sac_dir / "model.zip")
    assert sac.target_entropy == -5.0
    icm = IntrinsicCuriosity.load(sac_dir / "icm.pt", 4 * 3 + 2 * 5, 5, sac.icm_settings)
    assert icm.net.encoder[0].weight.shape == (8, 22)


def test_a_failed_check_restores_the_directory(tmp_path, monkeypatch):
    run_dir = copy_fixture(tmp_path, TD3)
    upgrade_run(run_dir)
    before = tree(run_dir)

    def shifted(spec: FeatureSpec, max_assets: int) -> Embedding:
        return Embedding(np.arange(1, spec.max_assets + 2), max_assets + 1)

    monkeypatch.setattr(widening, "action_embedding", shifted)  # old actions in wrong rows
    with pytest.raises(CheckpointUpgradeError, match=r"does not act like the original.*restored"):
        upgrade_run(run_dir, max_assets=3)
    assert tree(run_dir) == before
    [backup] = tmp_path.glob(f"{TD3}.bak-v{SCHEMA_VERSION}-*")
    assert tree(backup) == before


def test_widening_below_or_at_the_current_width_is_refused(tmp_path):
    run_dir = copy_fixture(tmp_path, SAC)
    upgrade_run(run_dir)
    with pytest.raises(
        CheckpointUpgradeError, match="max_assets 2 is below the current max_assets 3"
    ):
        upgrade_run(run_dir, max_assets=2)
    with pytest.raises(CheckpointUpgradeError, match="with max_assets 3; nothing to migrate"):
        upgrade_run(run_dir, max_assets=3)


def test_canonical_sums_ignore_inserted_zeros_where_blas_may_not():
    """Why the identity is checked in canonical float64: a realistic first layer (20 slots,
    window 30, 256 units) widened to 25 slots."""
    rng = np.random.default_rng(0)
    spec = FeatureSpec(20, window=30)
    emb = observation_embedding(spec, 25)
    w = rng.normal(size=(256, spec.obs_size)).astype(np.float32)
    x = rng.normal(size=(64, spec.obs_size)).astype(np.float32)
    b = rng.normal(size=256).astype(np.float32)
    w_big = np.zeros((256, emb.size), np.float32)
    w_big[:, emb.index] = w
    x_big = np.zeros((64, emb.size), np.float32)
    x_big[:, emb.index] = x
    old = canonical_linear(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64))
    new = canonical_linear(x_big.astype(np.float64), w_big.astype(np.float64), b.astype(np.float64))
    assert np.array_equal(old, new)
    f32 = torch.nn.functional.linear
    blas = f32(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b))
    blas_big = f32(torch.from_numpy(x_big), torch.from_numpy(w_big), torch.from_numpy(b))
    assert float((blas - blas_big).abs().max()) < 1e-4  # equal up to rounding, maybe not exactly
