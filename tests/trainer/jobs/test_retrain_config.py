"""Retraining (and every job) config: the trainer file, trainer_changes, --set, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocator.trainer.jobs.retrain.config import RetrainConfig, load_retrain_config
from allocator.trainer.training.config import load_config
from allocator.typed_config import ConfigError
from tests.trainer.jobs.helpers import CONFIGS

TINY_CONFIG = CONFIGS / "retrain_tiny.yaml"


# --- configuration -------------------------------------------------------------------------------


def test_config_reads_a_trainer_path_and_overrides_reach_into_it(tmp_path: Path) -> None:
    (tmp_path / "trainer.yaml").write_text("name: nightly\ntotal_timesteps: 1000\n")
    (tmp_path / "retrain.yaml").write_text(
        f"trainer: {tmp_path / 'trainer.yaml'}\nregistry: {tmp_path / 'models'}\n"
    )
    config = load_retrain_config(
        tmp_path / "retrain.yaml", ["trainer.total_timesteps=50", "gates.max_turnover=0.2"]
    )
    assert (config.trainer.name, config.trainer.total_timesteps) == ("nightly", 50)
    assert config.gates.max_turnover == 0.2
    assert config.holdout_cost_bps == config.trainer.env.cost_bps  # cost_bps unset: the trainer's
    # --set trainer=PATH swaps the trainer file before trainer.* overrides apply to it.
    (tmp_path / "other.yaml").write_text("name: other\n")
    swapped = load_retrain_config(
        tmp_path / "retrain.yaml", ["trainer.seed=7", f"trainer={tmp_path / 'other.yaml'}"]
    )
    assert (swapped.trainer.name, swapped.trainer.seed) == ("other", 7)
    # Python callers may name the trainer file directly.
    direct = RetrainConfig(trainer=str(tmp_path / "trainer.yaml"), registry=tmp_path, cost_bps=5)
    assert (direct.trainer.name, direct.holdout_cost_bps) == ("nightly", 5.0)


def test_trainer_changes_merge_into_the_trainer_file_before_set(tmp_path: Path) -> None:
    trainer = "name: nightly\ntotal_timesteps: 1000\nenv: {cost_bps: 5, window: 30}\n"
    (tmp_path / "trainer.yaml").write_text(trainer)
    (tmp_path / "retrain.yaml").write_text(
        f"trainer: {tmp_path / 'trainer.yaml'}\nregistry: {tmp_path / 'models'}\n"
        "trainer_changes: {total_timesteps: 2000, env: {window: 20}}\n"
    )
    config = load_retrain_config(tmp_path / "retrain.yaml")
    assert (config.trainer.total_timesteps, config.trainer.name) == (2000, "nightly")
    # merged key by key: env.cost_bps survives the change to env.window
    assert (config.trainer.env.window, config.trainer.env.cost_bps) == (20, 5)
    later = load_retrain_config(tmp_path / "retrain.yaml", ["trainer.total_timesteps=50"])
    assert later.trainer.total_timesteps == 50
    (tmp_path / "bad.yaml").write_text(
        f"trainer: {tmp_path / 'trainer.yaml'}\nregistry: {tmp_path / 'models'}\n"
        "trainer_changes: [total_timesteps=2000]\n"
    )
    with pytest.raises(ConfigError, match=r"bad.yaml: trainer_changes must be a mapping"):
        load_retrain_config(tmp_path / "bad.yaml")
    (tmp_path / "typo.yaml").write_text(
        f"trainer: {tmp_path / 'trainer.yaml'}\nregistry: {tmp_path / 'models'}\n"
        "trainer_changes: {env: {windw: 20}}\n"
    )
    with pytest.raises(ConfigError, match=r"trainer.env.windw"):
        load_retrain_config(tmp_path / "typo.yaml")


def test_config_errors_name_the_file_and_the_dotted_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"retrain_tiny.yaml: invalid configuration") as info:
        load_retrain_config(
            TINY_CONFIG, ["trainer.algorithm.gamma=2", "gates.max_turnover=-1", "bogus=1"]
        )
    message = str(info.value)
    assert "trainer.algorithm.gamma:" in message
    assert "gates.max_turnover:" in message
    assert "bogus:" in message
    with pytest.raises(
        ConfigError, match=r"retrain_tiny.yaml: trainer config '.*missing.yaml' not"
    ):
        load_retrain_config(TINY_CONFIG, [f"trainer={tmp_path / 'missing.yaml'}"])
    with pytest.raises(ConfigError, match="retrain config not found"):
        load_retrain_config(tmp_path / "missing.yaml")


def test_shipped_configs_load() -> None:
    full = load_retrain_config(CONFIGS / "retrain.yaml")
    assert (full.train_days, full.purge_days, full.holdout_days) == (1260, 21, 252)
    # Scheduled retraining trains the default recipe, the one the demo and walk-forward run.
    default = load_config(CONFIGS / "td3_shared_demo.yaml")
    assert full.trainer.model_dump(exclude={"data"}) == default.model_dump(exclude={"data"})
    tiny = load_retrain_config(TINY_CONFIG)
    assert tiny.trainer.total_timesteps <= 1000
