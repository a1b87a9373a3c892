"""The zero-action fallback of selection: a checkpoint that shows no skill over the zero action
(under the tilt mapping, the anchor) on the inner span is not kept; the run then holds the
anchor exactly, and says so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from allocator.artifacts.manifest import read_manifest
from allocator.trainer.agents.algorithms import zero_actions
from allocator.trainer.jobs.suite.job import held_out
from allocator.trainer.market.data import load_dataset
from allocator.trainer.sim.baselines import AnchorPolicy
from allocator.trainer.training.config import TrainConfig, load_config
from allocator.trainer.training.inputs import make_env, prepare_data
from allocator.trainer.training.run import build_model, train
from tests.markets import random_walk_market, write_market
from tests.trainer.tiny import TINY_SHARED, TINY_TRAINING

SELECTING = [
    "data.train_start=2019-01-01",
    "data.train_end=2019-12-31",
    "data.validation_start=2020-01-01",
    "data.validation_end=2020-06-30",
    "env.max_assets=4",
    "selection.enabled=true",
    "selection.inner_days=40",
    "selection.purge_days=5",
    "selection.eval_every=100",
    "selection.patience=0",
]


@pytest.fixture(scope="module")
def market(tmp_path_factory: pytest.TempPathFactory) -> Path:
    frame = random_walk_market(n_dates=400, n_assets=4, seed=5).to_frame()
    return write_market(frame, tmp_path_factory.mktemp("market") / "m.csv")


def config(market: Path, *extra: str) -> TrainConfig:
    return load_config(None, [*TINY_TRAINING, *SELECTING, f"data.dataset={market}", *extra])


@pytest.mark.parametrize("algorithm", ["td3", "sac"])
@pytest.mark.parametrize("shared", [False, True])
def test_zero_actions_makes_the_deterministic_action_exactly_zero(
    market: Path, algorithm: str, shared: bool
) -> None:
    cfg = config(market, f"algorithm.name={algorithm}", *(TINY_SHARED if shared else []))
    env = make_env(cfg, prepare_data(cfg))
    model = build_model(cfg, env)
    observations = np.stack([env.observation_space.sample() for _ in range(8)])
    observations[:, -(cfg.env.max_assets + 1) :] = 1.0  # every slot live
    before, _ = model.predict(observations, deterministic=True)
    assert np.abs(before).max() > 0
    zero_actions(model.actor)
    after, _ = model.predict(observations, deterministic=True)
    assert np.array_equal(after, np.zeros_like(after))


def test_a_run_without_inner_skill_keeps_the_zero_action_and_holds_the_anchor(
    market: Path, tmp_path: Path
) -> None:
    """On a random walk 300 steps learn nothing: at a 99% interval no checkpoint beats the
    anchor on the inner span, so the saved model acts 0 and validates as the anchor itself."""
    run = train(config(market, *TINY_SHARED, "selection.fallback_level=0.99"), tmp_path / "run")
    summary = json.loads((run.run_dir / "run.json").read_text())["selection"]
    test = summary["fallback"]
    assert test["zero_action_kept"] is True
    assert test["low"] <= 0 < test["level"] == 0.99
    assert "zero action kept instead" in summary["reason"]
    assert json.loads((run.run_dir / "selection.json").read_text())["fallback"] == test
    assert read_manifest(run.run_dir).holds_anchor  # what an operator reads in the registry
    policy = run.validation["td3"]
    assert np.all(policy.raw_weights.to_numpy() >= 0)
    anchor = held_out(run, load_dataset(str(market)), AnchorPolicy())
    np.testing.assert_allclose(policy.nav.to_numpy(), anchor.nav.to_numpy(), rtol=0, atol=1e-12)
    reloaded = type(run.model).load(run.run_dir / "model.zip")
    obs = run.model.observation_space.sample()
    assert not reloaded.predict(obs, deterministic=True)[0].any()


def test_without_the_fallback_the_checkpoint_is_kept_and_no_test_is_made(
    market: Path, tmp_path: Path
) -> None:
    run = train(config(market, *TINY_SHARED), tmp_path / "run")
    assert "fallback" not in run.summary["selection"]
    assert not read_manifest(run.run_dir).holds_anchor
    obs = run.model.observation_space.sample()
    assert run.model.predict(obs, deterministic=True)[0].any()
    with pytest.raises(ValueError, match="fallback_level"):
        load_config(None, ["selection.fallback_level=1.5"])
