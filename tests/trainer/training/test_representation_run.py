"""Training runs with the shared policy, per-asset features and the tilt mapping, end to end.

The run must build the shared networks, fit the feature statistics on the training span only,
audit the tilt mapping, and be refused by export (the graph and server cannot run it yet).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from allocator.portfolio import FeatureNormalization, fit_feature_normalization
from allocator.trainer.agents.shared_policies import SharedSACPolicy, SharedTD3Policy
from allocator.trainer.market.data import load_dataset
from allocator.trainer.training.config import load_config
from allocator.trainer.training.inputs import split_training_span
from allocator.trainer.training.run import TrainingRun, train
from allocator.trainer.training.run_dir import FEATURE_NORMALIZATION_FILE
from allocator.typed_config import ConfigError
from tests.trainer.tiny import TINY_TRAINING

ROOT = Path(__file__).resolve().parents[3]
SHORT = [*TINY_TRAINING, "data.validation_end=2015-03-31", "env.max_assets=8"]


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory: pytest.TempPathFactory) -> TrainingRun:
    cfg = load_config(ROOT / "configs" / "td3_shared_demo.yaml", SHORT)
    return train(cfg, tmp_path_factory.mktemp("shared") / "run")


def test_the_shared_demo_config_says_what_it_changes() -> None:
    """The default recipe: td3_demo.yaml's TD3 with the representation, an equal-weight anchor
    with 5% cash tilted with k 2, the actor held off its bounds and inner-span selection, and
    nothing else changed."""
    cfg = load_config(ROOT / "configs" / "td3_shared_demo.yaml")
    assert cfg.policy == "shared"
    assert cfg.env.features == "asset_v1"
    assert cfg.env.action.mapping == "tilt"
    assert (cfg.env.action.anchor.kind, cfg.env.action.anchor.cash_share) == ("equal", 0.05)
    assert cfg.env.action.k == 2.0
    assert cfg.selection.enabled
    assert cfg.algorithm.name == "td3"
    assert cfg.algorithm.action_bound.active
    demo = load_config(ROOT / "configs" / "td3_demo.yaml")
    assert not demo.algorithm.action_bound.active
    assert cfg.algorithm.model_dump(exclude={"action_bound"}) == demo.algorithm.model_dump(
        exclude={"action_bound"}
    )
    assert cfg.noise == demo.noise
    assert cfg.total_timesteps == demo.total_timesteps


def test_the_shared_sac_demo_config_changes_only_the_representation() -> None:
    cfg = load_config(ROOT / "configs" / "sac_icm_shared_demo.yaml")
    demo = load_config(ROOT / "configs" / "sac_icm_demo.yaml")
    assert (cfg.policy, cfg.env.features, cfg.env.action.mapping) == ("shared", "asset_v1", "tilt")
    assert cfg.algorithm == demo.algorithm
    assert cfg.icm == demo.icm
    assert cfg.env.reward == demo.env.reward
    assert cfg.total_timesteps == demo.total_timesteps


def test_saying_nothing_new_keeps_the_mlp_on_returns_with_the_affine_mapping() -> None:
    cfg = load_config(None)
    assert cfg.policy == "mlp"
    assert cfg.env.is_default_representation


def test_an_unknown_policy_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="policy"):
        load_config(None, ["policy=transformer"])


def test_shared_td3_run_builds_the_shared_networks(shared_run: TrainingRun) -> None:
    policy = shared_run.model.policy
    assert isinstance(policy, SharedTD3Policy)
    assert shared_run.summary["validation"]["td3"]["turnover"] >= 0


def test_feature_normalization_is_fitted_on_the_training_span_and_saved(
    shared_run: TrainingRun,
) -> None:
    """The part the model learns from: with selection on (the shipped recipe), the training
    span up to the purge before its inner span, which the statistics must not see either."""
    cfg = shared_run.config
    assert cfg.selection.enabled
    train_data = load_dataset("sp500").between(cfg.data.train_start, cfg.data.train_end)
    fit_end = split_training_span(train_data, cfg.selection, cfg.env).fit_end
    assert fit_end < train_data.dates[-1].date()
    fit = train_data.between(None, fit_end)
    expected = fit_feature_normalization(fit.prices, cfg.env.asset_feature_spec)
    assert expected != fit_feature_normalization(train_data.prices, cfg.env.asset_feature_spec)
    assert shared_run.feature_norm == expected
    saved = json.loads((shared_run.run_dir / FEATURE_NORMALIZATION_FILE).read_text())
    assert FeatureNormalization.from_dict(saved) == expected
    assert saved["spec"] == cfg.env.asset_feature_spec.to_dict()
    manifest = json.loads((shared_run.run_dir / "manifest.json").read_text())
    assert FEATURE_NORMALIZATION_FILE in manifest["files"]


def test_saturation_audit_reports_the_tilt_mapping(shared_run: TrainingRun) -> None:
    audit = json.loads((shared_run.run_dir / "action_saturation.json").read_text())
    assert audit["mapping"]["name"] == "tilt"
    assert audit["mapping"]["k"] == shared_run.config.env.action.k
    assert 0.0 <= audit["near_bound_ratio"] <= 1.0
    assert 0.0 <= audit["mapping"]["anchor_held_ratio"] <= 1.0
    n_live = 1 + len(json.loads((shared_run.run_dir / "validation.json").read_text())["assets"])
    assert audit["live_slots_per_step"] == n_live


def test_shared_sac_with_curiosity_trains_on_asset_features(tmp_path: Path) -> None:
    cfg = load_config(
        ROOT / "configs" / "sac_icm_demo.yaml",
        [*SHORT, "policy=shared", "env.features=asset_v1", "icm.warmup_steps=100"],
    )
    run = train(cfg, tmp_path / "sac")
    assert isinstance(run.model.policy, SharedSACPolicy)
    assert (run.run_dir / "icm.pt").is_file()
    assert np.isfinite(run.summary["validation"]["sac"]["sharpe"])


def test_validation_judges_the_tilt_against_its_anchor(shared_run: TrainingRun) -> None:
    """The anchor is backtested beside equal weight and HRP, on the agent's assets and days,
    and validation.json says what the tilt adds to it, with an interval."""
    agent, anchor = shared_run.validation["td3"], shared_run.validation["anchor"]
    assert anchor.settings["assets"] == agent.settings["assets"]
    assert list(anchor.returns.index) == list(agent.returns.index)
    weights = anchor.raw_weights
    assert weights["cash"].to_numpy() == pytest.approx(0.05)  # the recipe's cash_share
    n_assets = weights.shape[1] - 1  # the recipe's anchor: the rest in equal parts
    assert weights.iloc[:, 1:].to_numpy() == pytest.approx(0.95 / n_assets)
    payload = json.loads((shared_run.run_dir / "validation.json").read_text())
    assert set(payload["metrics"]) == {"td3", "equal-weight", "hrp", "anchor"}
    over = payload["excess_sharpe_vs_anchor"]
    assert over["estimate"] == pytest.approx(
        payload["metrics"]["td3"]["sharpe"] - payload["metrics"]["anchor"]["sharpe"], abs=1e-9
    )
    assert over["low"] <= over["estimate"] <= over["high"]
