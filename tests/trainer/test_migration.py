"""``allocator checkpoint migrate`` on the frozen version-1 runs in tests/fixtures/checkpoints.

Every test migrates a copy in tmp_path; the fixtures themselves are never touched.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from allocator.artifacts.manifest import (
    MANIFEST_FILE,
    SCHEMA_VERSION,
    read_manifest,
    verify_checksums,
    write_manifest,
)
from allocator.cli import main
from allocator.portfolio import FeatureSpec, action_to_weights
from allocator.trainer.agents.icm import IntrinsicCuriosity
from allocator.trainer.checkpoints import upgrade as migration
from allocator.trainer.checkpoints.upgrade import (
    FLOAT32_ATOL,
    MigrationError,
    ProbeParts,
    canonical_forward,
    canonical_linear,
    load_model,
    migrate,
    observation_embedding,
    probe_masks,
    probe_parts,
    run_migration,
)
from allocator.trainer.sim.env import EnvConfig, PortfolioEnv
from tests.markets import random_walk_market

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints"
TD3, SAC = "v1_td3", "v1_sac_icm"
WIDTH = {TD3: 2, SAC: 3}
ALGO = {TD3: "td3", SAC: "sac"}


def copy_fixture(tmp_path: Path, name: str) -> Path:
    return Path(shutil.copytree(FIXTURES / name, tmp_path / name))


def tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# --- version 1 -> 2 ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", [TD3, SAC])
def test_v1_fixture_migrates_to_v2_with_identical_probe_actions(tmp_path, name):
    run_dir = copy_fixture(tmp_path, name)
    assert not (run_dir / MANIFEST_FILE).exists()
    result = run_migration(run_dir)
    assert (result.from_version, result.to_version) == (1, SCHEMA_VERSION)
    assert result.probe.observations == 64
    assert result.probe.float32_max_diff == 0.0
    manifest = read_manifest(run_dir)  # the current schema reads it
    verify_checksums(run_dir, manifest)
    assert manifest == result.manifest
    assert manifest.algorithm == ALGO[name]
    assert manifest.feature_spec.max_assets == WIDTH[name]
    assert manifest.feature_spec.window == 3
    assert manifest.widened_from is None
    assert manifest.data.universe == ["A0", "A1", "A2"]
    assert set(manifest.files) >= {"model.zip", "config.yaml", "normalization.json"}
    validation = json.loads((run_dir / "validation.json").read_text())
    assert manifest.metrics == validation["metrics"]
    stats = json.loads((run_dir / "normalization.json").read_text())
    assert manifest.normalization.model_dump() == stats
    assert manifest.library_versions["torch"].startswith("2.")
    assert manifest.created.startswith("2026-")  # when training ran (SB3's start_time)
    [record] = manifest.migrations
    assert (record.from_version, record.to_version) == (1, 2)
    assert str(result.backup) in record.note
    if name == SAC:
        assert manifest.icm is not None
        assert "icm.pt" in manifest.files
        assert "config data.assets" in record.note
    else:
        assert manifest.icm is None
        assert "market.csv" in record.note  # universe from the dataset beside the run


def test_backup_is_a_sibling_copy_of_the_original(tmp_path):
    run_dir = copy_fixture(tmp_path, TD3)
    result = run_migration(run_dir)
    assert result.backup.parent == run_dir.parent
    assert result.backup.name.startswith(f"{TD3}.bak-v1-")
    assert tree(result.backup) == tree(FIXTURES / TD3)
    assert set(tree(run_dir)) == set(tree(result.backup)) | {MANIFEST_FILE}


def test_migrating_a_current_directory_again_is_refused(tmp_path):
    run_dir = copy_fixture(tmp_path, TD3)
    migrate(run_dir)
    before = sorted(tmp_path.iterdir())
    with pytest.raises(MigrationError, match="already at schema version 2; nothing to migrate"):
        migrate(run_dir)
    assert sorted(tmp_path.iterdir()) == before  # no second backup, nothing changed


def test_a_failed_step_restores_the_directory(tmp_path):
    run_dir = copy_fixture(tmp_path, TD3)
    (run_dir / "market.csv").unlink()  # the universe must come from the dataset
    original = tree(run_dir)
    with pytest.raises(MigrationError, match=r"cannot be loaded.*restored"):
        migrate(run_dir)
    assert tree(run_dir) == original
    [backup] = tmp_path.glob(f"{TD3}.bak-v1-*")
    assert tree(backup) == original


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"to_version": 9}, "unknown target schema version 9"),
        ({"to_version": 0}, "unknown target schema version 0"),
        ({"max_assets": 1}, "below the current max_assets 2"),
        ({"to_version": 1}, "already at schema version 1"),
        ({"to_version": 1, "max_assets": 3}, "widening needs the current schema"),
    ],
)
def test_bad_requests_are_refused_before_anything_changes(tmp_path, kwargs, message):
    run_dir = copy_fixture(tmp_path, TD3)
    with pytest.raises(MigrationError, match=message):
        migrate(run_dir, **kwargs)
    assert [p.name for p in tmp_path.iterdir()] == [TD3]
    assert tree(run_dir) == tree(FIXTURES / TD3)


def test_missing_and_foreign_directories_are_refused(tmp_path):
    with pytest.raises(MigrationError, match="no such directory"):
        migrate(tmp_path / "nope")
    with pytest.raises(MigrationError, match="not a run directory"):
        migrate(tmp_path)


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
    migrate(run_dir)
    old_m = WIDTH[name]
    new_m = old_m + extra
    result = run_migration(run_dir, max_assets=new_m)
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
    assert len(manifest.migrations) == 2

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
    old_actor = migration._actor_layers(old)["actor"]
    new_actor = migration._actor_layers(new)["actor"]
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
    migrate(run_dir, max_assets=4)  # version 1 straight to a widened version 2
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
    assert [(r.from_version, r.to_version) for r in manifest.migrations] == [(1, 2), (2, 2)]
    assert manifest.widened_from == 2


def test_widened_models_load_and_keep_training(tmp_path):
    """Optimizer moments, action noise and spaces fit the new shapes: gradient steps run."""
    td3_dir, sac_dir = copy_fixture(tmp_path, TD3), copy_fixture(tmp_path, SAC)
    migrate(td3_dir, max_assets=3)
    migrate(sac_dir, max_assets=4)
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
    migrate(run_dir)
    before = tree(run_dir)

    def shifted(spec: FeatureSpec, max_assets: int) -> migration.Embedding:
        return migration.Embedding(np.arange(1, spec.max_assets + 2), max_assets + 1)

    monkeypatch.setattr(migration, "action_embedding", shifted)  # old actions in wrong rows
    with pytest.raises(MigrationError, match=r"does not act like the original.*restored"):
        migrate(run_dir, max_assets=3)
    assert tree(run_dir) == before
    [backup] = tmp_path.glob(f"{TD3}.bak-v2-*")
    assert tree(backup) == before


def test_widening_below_or_at_the_current_width_is_refused(tmp_path):
    run_dir = copy_fixture(tmp_path, SAC)
    migrate(run_dir)
    with pytest.raises(MigrationError, match="max_assets 2 is below the current max_assets 3"):
        migrate(run_dir, max_assets=2)
    with pytest.raises(MigrationError, match="with max_assets 3; nothing to migrate"):
        migrate(run_dir, max_assets=3)


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


# --- command line -----------------------------------------------------------------------------


def test_cli_migrates_and_widens(tmp_path):
    run_dir = copy_fixture(tmp_path, TD3)
    runner = CliRunner()
    out = runner.invoke(main, ["checkpoint", "migrate", str(run_dir)])
    assert out.exit_code == 0, out.output
    assert f"schema v1 -> v{SCHEMA_VERSION}" in out.output
    [backup] = tmp_path.glob(f"{TD3}.bak-v1-*")
    assert f"backup: {backup}" in out.output
    assert "max |action diff| 0" in out.output

    out = runner.invoke(main, ["checkpoint", "migrate", str(run_dir), "--max-assets", "3"])
    assert out.exit_code == 0, out.output
    assert "widened: max_assets 2 -> 3" in out.output
    assert "canonical float64 max |diff| actor 0, critics 0" in out.output
    assert "float32 predict max |diff|" in out.output
    inspect = runner.invoke(main, ["checkpoint", "inspect", str(run_dir)])
    assert inspect.exit_code == 0, inspect.output
    assert "widened from    2 assets" in inspect.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-assets", "1"], "below the current max_assets 2"),
        (["--to-version", "7"], "unknown target schema version 7"),
    ],
)
def test_cli_bad_input_exits_2(tmp_path, args, message):
    run_dir = copy_fixture(tmp_path, TD3)
    out = CliRunner().invoke(main, ["checkpoint", "migrate", str(run_dir), *args])
    assert out.exit_code == 2
    assert message in out.output


def test_cli_refuses_missing_and_current_directories(tmp_path):
    runner = CliRunner()
    out = runner.invoke(main, ["checkpoint", "migrate", str(tmp_path / "nope")])
    assert out.exit_code == 2
    assert "no such directory" in out.output
    run_dir = copy_fixture(tmp_path, SAC)
    assert runner.invoke(main, ["checkpoint", "migrate", str(run_dir)]).exit_code == 0
    out = runner.invoke(main, ["checkpoint", "migrate", str(run_dir)])
    assert out.exit_code == 2
    assert "already at schema version 2; nothing to migrate" in out.output


def test_exported_models_are_not_widened(tmp_path):
    run_dir = copy_fixture(tmp_path, TD3)
    manifest = migrate(run_dir)
    write_manifest(run_dir, manifest.model_copy(update={"export": {"registry_name": "x"}}))
    with pytest.raises(MigrationError, match="an exported model"):
        migrate(run_dir, max_assets=3)
