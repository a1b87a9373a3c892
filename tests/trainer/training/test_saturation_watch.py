"""The saturation watch: a collapsed actor is flagged while it trains and never selected."""

from __future__ import annotations

import json
import logging
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback

from allocator.trainer.agents.sac import SmoothSAC
from allocator.trainer.agents.shared_policies import SharedTD3Policy
from allocator.trainer.agents.td3 import SmoothTD3
from allocator.trainer.training.config import TrainConfig, load_config
from allocator.trainer.training.inputs import make_env, prepare_data
from allocator.trainer.training.run import TrainingSession, build_model, train
from allocator.trainer.training.run_dir import representation_fields, saved_center_assets
from allocator.trainer.training.saturation import (
    COLLAPSE_SHARE,
    PROBE_SIZE,
    collapse_warnings,
)
from allocator.typed_config import ConfigError
from tests.markets import random_walk_market, write_market
from tests.trainer.tiny import TINY_SHARED, TINY_TRAINING

PERIODS = [
    "data.train_start=2019-01-01",
    "data.train_end=2019-12-31",
    "data.validation_start=2020-01-01",
    "data.validation_end=2020-06-30",
    "env.max_assets=4",
]
SELECTING = [
    "selection.enabled=true",
    "selection.inner_days=40",
    "selection.purge_days=5",
    "selection.eval_every=100",
    "selection.patience=0",
    # No gradient step: the actor moves only when a test moves it.
    "algorithm.learning_starts=100000",
]


@pytest.fixture(scope="module")
def market(tmp_path_factory: pytest.TempPathFactory) -> Path:
    frame = random_walk_market(n_dates=400, n_assets=5, seed=3).to_frame()
    return write_market(frame, tmp_path_factory.mktemp("market") / "m.csv")


def config(market: Path, *extra: str) -> TrainConfig:
    return load_config(None, [*TINY_TRAINING, *PERIODS, f"data.dataset={market}", *extra])


def push_to_the_corner(model: SmoothTD3, shift: float) -> None:
    """Add ``shift`` to the bias of every actor output: +20 puts every action at +1."""
    actor = model.actor
    with th.no_grad():
        if isinstance(model.policy, SharedTD3Policy):
            actor.net.rho[-1].bias += shift  # type: ignore[union-attr, index, operator]
            actor.net.cash_head.bias += shift  # type: ignore[union-attr, operator]
        else:
            actor.mu[-2].bias += shift  # type: ignore[union-attr, index, operator]


class CornerAt(BaseCallback):
    """Pushes the actor into the saturated corner at step ``on`` and back out at ``off``."""

    def __init__(self, on: int, off: int) -> None:
        super().__init__()
        self.on, self.off = on, off

    def _on_step(self) -> bool:
        assert isinstance(self.model, SmoothTD3)
        if self.num_timesteps == self.on:
            push_to_the_corner(self.model, 20.0)
        elif self.num_timesteps == self.off:
            push_to_the_corner(self.model, -20.0)
        return True


def test_the_shared_policy_centres_by_default_and_the_flag_reaches_the_model(
    market: Path,
) -> None:
    assert TrainConfig().shared.center_assets is True
    assert config(market, *TINY_SHARED).shared.center_assets is True
    for center in (True, False):
        cfg = config(market, *TINY_SHARED, f"shared.center_assets={str(center).lower()}")
        model = build_model(cfg, make_env(cfg, prepare_data(cfg)))
        assert model.actor.net.center_assets is center  # type: ignore[union-attr]


def test_a_model_saved_without_the_flag_loads_uncentred_and_the_manifest_says_so(
    market: Path, tmp_path: Path
) -> None:
    """A shared model saved before centring existed has no ``center_assets`` in its
    ``policy_kwargs``: it loads uncentred (as trained), and the manifest reads the model,
    not the config, where a missing key means on."""
    cfg = config(market, *TINY_SHARED)
    data = prepare_data(cfg)
    model = build_model(cfg, make_env(cfg, data))
    model.save(tmp_path / "new.zip")
    assert saved_center_assets(tmp_path / "new.zip") is True
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    with (
        zipfile.ZipFile(tmp_path / "new.zip") as src,
        zipfile.ZipFile(run_dir / "model.zip", "w") as dst,
    ):
        for item in src.infolist():
            raw = src.read(item.filename)
            if item.filename == "data":
                saved = json.loads(raw)
                del saved["policy_kwargs"]["center_assets"]
                raw = json.dumps(saved).encode()
            dst.writestr(item, raw)
    old = SmoothTD3.load(run_dir / "model.zip", device="cpu")
    assert old.actor.net.center_assets is False  # type: ignore[union-attr]
    assert saved_center_assets(run_dir / "model.zip") is False
    (run_dir / "feature_normalization.json").write_text(
        json.dumps(
            {"spec": cfg.env.asset_feature_spec.to_dict(), **data.feature_norm.to_dict()}  # type: ignore[union-attr]
        )
    )
    assert cfg.shared.center_assets is True
    assert representation_fields(cfg, run_dir)["policy"].center_assets is False


def test_the_checkpoint_fixtures_load_with_what_they_were_saved_with() -> None:
    """The frozen version-1 runs (flat MLPs) still load; their configs still validate."""
    root = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"
    for name, algorithm in (("v1_td3", SmoothTD3), ("v1_sac_icm", SmoothSAC)):
        cfg = load_config(root / name / "config.yaml")
        assert cfg.policy == "mlp"
        assert saved_center_assets(root / name / "model.zip") is False
        model = algorithm.load(root / name / "model.zip", device="cpu")
        assert type(model.policy).__name__ in {"TD3Policy", "SACPolicy"}


def test_the_flat_mlp_under_the_tilt_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"policy: mlp with env\.action\.mapping: tilt"):
        load_config(None, ["env.features=asset_v1", "env.action.mapping=tilt"])


@pytest.mark.parametrize("policy", ["mlp", "shared-uncentred", "shared"])
def test_the_watch_flags_the_saturated_corner_and_not_a_fresh_actor(
    market: Path, tmp_path: Path, policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    extra = {
        "mlp": [],
        "shared-uncentred": [*TINY_SHARED, "shared.center_assets=false"],
        "shared": list(TINY_SHARED),
    }[policy]
    session = TrainingSession.start(config(market, *extra), tmp_path / "run")
    watch = session.watch
    assert watch.probe.observations.shape[0] == PROBE_SIZE
    fresh = watch.check()
    assert not fresh.collapsed
    assert fresh.near_bound_ratio < 0.05
    assert isinstance(session.model, SmoothTD3)
    push_to_the_corner(session.model, 20.0)
    with caplog.at_level(logging.WARNING, logger="allocator.trainer"):
        cornered = watch.check()
    if policy == "shared":
        # Centred, no shift moves every asset together: only cash reaches its bound.
        assert not cornered.collapsed
        assert cornered.near_bound_ratio < COLLAPSE_SHARE
        assert not caplog.records
    else:
        assert cornered.collapsed
        assert cornered.near_bound_ratio == 1.0
        assert cornered.mean_kappa < 1e-6
        assert [r.levelname for r in caplog.records] == ["WARNING"]
        assert "actor collapsed at step 0" in caplog.records[0].getMessage()
        assert watch.state.first_collapsed_step == 0


def test_selection_skips_a_collapsed_candidate_however_it_scores(
    market: Path, tmp_path: Path
) -> None:
    session = TrainingSession.start(config(market, *SELECTING), tmp_path / "run")
    assert session.selection is not None
    session.callbacks.insert(0, CornerAt(on=200, off=300))
    real, scores = session.selection.score, iter([1.0, 3.0, 2.0])
    session.selection.score = lambda model: {**real(model), "sharpe": next(scores)}
    session.learn()
    run = session.finish()
    selection = json.loads((run.run_dir / "selection.json").read_text())
    assert [e["collapsed"] for e in selection["evaluations"]] == [False, True, False]
    assert selection["evaluations"][1]["score"] == 3.0  # the highest, and not kept
    chosen = run.summary["selection"]
    assert chosen["chosen_step"] == 300
    assert chosen["collapsed_evaluations"] == 1
    assert "warning" not in chosen
    assert "1 collapsed evaluation(s) were ineligible" in chosen["reason"]
    watch = run.summary["saturation_watch"]
    assert watch["collapsed"] is True
    assert watch["first_collapsed_step"] == 200
    assert watch["last"]["collapsed"] is False
    assert "recovered" in watch["warning"]
    logged = pd.read_csv(run.run_dir / "progress.csv")
    assert logged["train/actor_collapsed"].dropna().tolist() == [0.0, 1.0, 0.0]


def test_a_run_collapsed_throughout_keeps_its_last_model_and_says_so(
    market: Path, tmp_path: Path
) -> None:
    session = TrainingSession.start(config(market, *SELECTING), tmp_path / "run")
    assert isinstance(session.model, SmoothTD3)
    push_to_the_corner(session.model, 20.0)
    session.learn()
    run = session.finish()
    chosen = run.summary["selection"]
    assert chosen["chosen_step"] == chosen["last_step"] == 300
    assert chosen["collapsed_evaluations"] == 3
    assert "collapsed at all 3 evaluations" in chosen["warning"]
    assert not (run.run_dir / "best_model.zip").exists()
    on_disk = json.loads((run.run_dir / "run.json").read_text())
    watch = on_disk["saturation_watch"]
    assert watch["collapsed"] is True
    assert watch["first_collapsed_step"] == 100
    assert watch["collapsed_checks"] == watch["checks"] == 3
    assert watch["last"]["near_bound_ratio"] == 1.0
    lines = collapse_warnings(on_disk)
    assert len(lines) == 2
    assert lines[0].startswith("WARNING: the actor collapsed")
    assert "still collapsed" in lines[0]
    assert lines[1].startswith("WARNING: selection kept no checkpoint")


def test_a_healthy_run_records_its_checks_and_no_warning(market: Path, tmp_path: Path) -> None:
    cfg = config(market, "saturation_watch.every=100", "total_timesteps=300")
    run = train(cfg, tmp_path / "run")
    watch = run.summary["saturation_watch"]
    assert watch["collapsed"] is False
    assert watch["first_collapsed_step"] is None
    assert watch["checks"] == 3
    assert watch["last"]["step"] == 300
    assert "warning" not in watch
    assert collapse_warnings(run.summary) == []
    logged = pd.read_csv(run.run_dir / "progress.csv")
    assert logged["train/saturation_near_bound"].notna().sum() >= 2
