"""Choosing the kept checkpoint on an inner span of the training span, never on later prices."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from allocator.portfolio import fit_normalization
from allocator.trainer.agents.td3 import SmoothTD3
from allocator.trainer.market.data import MarketData, load_dataset
from allocator.trainer.sim.env import EnvConfig
from allocator.trainer.training.config import SelectionSettings, TrainConfig, load_config
from allocator.trainer.training.inputs import split_training_span
from allocator.trainer.training.policy_eval import validate_policy
from allocator.trainer.training.run import TrainingRun, TrainingSession, train
from allocator.typed_config import ConfigError
from tests.markets import write_sp500_slice
from tests.trainer.tiny import TINY_TRAINING

ASSETS = ["AAPL", "AMD", "BAC", "BBY", "CVX"]
TRAIN_END = "2013-12-31"
SELECTING = [
    *TINY_TRAINING,
    "data.train_start=2010-01-01",
    f"data.train_end={TRAIN_END}",
    "data.validation_start=2014-01-01",
    "data.validation_end=2014-06-30",
    "env.max_assets=5",
    "selection.enabled=true",
    "selection.inner_days=60",
    "selection.purge_days=5",
    "selection.eval_every=100",
    "selection.patience=0",
]


def write_prices(path: Path, *, garbage_after_training: bool) -> Path:
    return write_sp500_slice(path, ASSETS, TRAIN_END, garbage_after_training=garbage_after_training)


def config(prices: Path, *extra: str) -> TrainConfig:
    return load_config(None, [*SELECTING, f"data.dataset={prices}", *extra])


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def prices(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_prices(
        tmp_path_factory.mktemp("prices") / "clean.csv", garbage_after_training=False
    )


@pytest.fixture(scope="module")
def clean_run(prices: Path, tmp_path_factory: pytest.TempPathFactory) -> TrainingRun:
    return train(config(prices), tmp_path_factory.mktemp("clean") / "run")


def test_selection_never_reads_the_prices_after_the_training_span(
    clean_run: TrainingRun, tmp_path: Path
) -> None:
    garbage = write_prices(tmp_path / "garbage.csv", garbage_after_training=True)
    dirty_run = train(config(garbage), tmp_path / "run")
    clean = json.loads((clean_run.run_dir / "selection.json").read_text())
    dirty = json.loads((dirty_run.run_dir / "selection.json").read_text())
    assert len(clean["evaluations"]) == 3
    assert dirty["best_step"] == clean["best_step"]
    assert dirty["best_score"] == clean["best_score"]
    assert dirty["evaluations"] == clean["evaluations"]
    for a, b in zip(
        actor_weights(SmoothTD3.load(dirty_run.run_dir / "best_model.zip")),
        actor_weights(SmoothTD3.load(clean_run.run_dir / "best_model.zip")),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    # The garbage did reach the run: the validation span (after training) scores differently.
    assert dirty_run.summary["validation"] != clean_run.summary["validation"]


def test_the_inner_span_lies_in_the_training_span_after_the_purge(
    clean_run: TrainingRun, prices: Path
) -> None:
    split = json.loads((clean_run.run_dir / "selection.json").read_text())["split"]
    dates = load_dataset(prices).between("2010-01-01", TRAIN_END).dates
    fit_end, inner_start, inner_end = (
        pd.Timestamp(split[k]) for k in ("fit_end", "inner_start", "inner_end")
    )
    assert dates[0] < fit_end < inner_start <= inner_end == dates[-1]
    assert ((dates > fit_end) & (dates < inner_start)).sum() == 5  # the purge, used by neither
    assert (dates >= inner_start).sum() == 60
    # The environment and the normalization saw only the part before the purge.
    fit = load_dataset(prices).between("2010-01-01", fit_end)
    saved = json.loads((clean_run.run_dir / "normalization.json").read_text())
    assert saved == fit_normalization(fit.prices, axis=0).to_dict()
    assert clean_run.stats == fit_normalization(fit.prices, axis=0)


def test_the_run_keeps_the_chosen_checkpoint_and_says_why(clean_run: TrainingRun) -> None:
    run_dir = clean_run.run_dir
    selection = json.loads((run_dir / "selection.json").read_text())
    summary = json.loads((run_dir / "run.json").read_text())["selection"]
    assert summary["chosen_step"] == selection["best_step"]
    assert summary["chosen_score"] == selection["best_score"]
    assert summary["last_step"] == 300
    assert f"step {selection['best_step']}" in summary["reason"]
    assert sha256(run_dir / "model.zip") == sha256(run_dir / "best_model.zip")
    assert (run_dir / "last_model.zip").is_file()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["files"]["model.zip"] == sha256(run_dir / "best_model.zip")
    logged = pd.read_csv(run_dir / "progress.csv")
    assert logged["selection/inner_sharpe"].notna().sum() == 3


def test_early_stopping_stops_a_policy_that_never_changes(prices: Path, tmp_path: Path) -> None:
    # No gradient step before learning_starts: the deterministic policy is constant, so its
    # inner score never improves after the first evaluation.
    cfg = config(
        prices,
        "total_timesteps=1000",
        "algorithm.learning_starts=100000",
        "selection.patience=1",
    )
    run = train(cfg, tmp_path / "run")
    assert run.summary["timesteps"] == 200
    chosen = run.summary["selection"]
    assert chosen["stopped_early"] is True
    assert chosen["evaluations"] == 2
    assert chosen["chosen_step"] == 100
    assert "stopped" in chosen["reason"]


def scripted(session: TrainingSession, scores: list[float]) -> Iterator[float]:
    """Replace the inner score by ``scores`` in turn (the other figures stay the backtest's)."""
    assert session.selection is not None
    real, queue = session.selection.score, iter(scores)

    def score(model: object) -> dict[str, float]:
        return {**real(model), "sharpe": next(queue)}  # type: ignore[arg-type]

    session.selection.score = score  # type: ignore[method-assign]
    return queue


def actor_weights(model: SmoothTD3) -> list[np.ndarray]:
    return [p.detach().cpu().numpy().copy() for p in model.actor.parameters()]


def test_the_best_checkpoint_is_kept_when_the_inner_score_peaks_early(
    prices: Path, tmp_path: Path
) -> None:
    session = TrainingSession.start(config(prices, "total_timesteps=400"), tmp_path / "run")
    scripted(session, [1.0, 3.0, 2.0, 0.5])  # best at the second evaluation, step 200
    session.learn()
    run = session.finish()
    run_dir = run.run_dir
    assert run.summary["selection"]["chosen_step"] == 200
    assert run.summary["selection"]["last_step"] == 400
    assert sha256(run_dir / "model.zip") == sha256(run_dir / "best_model.zip")
    best = SmoothTD3.load(run_dir / "best_model.zip")
    last = SmoothTD3.load(run_dir / "last_model.zip")
    assert isinstance(run.model, SmoothTD3)
    for kept, b in zip(actor_weights(run.model), actor_weights(best), strict=True):
        np.testing.assert_array_equal(kept, b)
    assert any(
        not np.array_equal(b, lst)
        for b, lst in zip(actor_weights(best), actor_weights(last), strict=True)
    )
    # The validation backtest and the manifest describe the kept (best) model.
    again, _ = validate_policy(best, run.config, load_dataset(prices), run.stats)
    validation = json.loads((run_dir / "validation.json").read_text())["metrics"]["td3"]
    assert validation == pytest.approx(again["td3"].metrics())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["metrics"]["td3"] == pytest.approx(validation)


@pytest.mark.parametrize(
    ("settings", "fit_days", "inner_days"),
    [
        ({"inner_days": 60, "purge_days": 5}, 935, 60),
        ({"inner_fraction": 0.25, "purge_days": 0}, 750, 250),
        ({"inner_fraction": 0.1, "purge_days": 10}, 890, 100),
    ],
)
def test_the_training_span_is_cut_into_training_purge_and_inner_span(
    settings: dict[str, float], fit_days: int, inner_days: int
) -> None:
    dates = pd.bdate_range("2010-01-01", periods=1000)
    data = MarketData(np.ones((1000, 2)), dates, ("A", "B"), "test")
    split = split_training_span(data, SelectionSettings(**settings), EnvConfig(window=10))
    assert (split.fit_days, split.inner_days) == (fit_days, inner_days)
    assert pd.Timestamp(split.fit_end) == dates[fit_days - 1]
    assert pd.Timestamp(split.inner_start) == dates[1000 - inner_days]
    assert pd.Timestamp(split.inner_end) == dates[-1]
    gap = (dates > pd.Timestamp(split.fit_end)) & (dates < pd.Timestamp(split.inner_start))
    assert gap.sum() == split.purge_days


def test_a_training_part_too_short_for_one_episode_is_refused_naming_the_keys() -> None:
    dates = pd.bdate_range("2010-01-01", periods=400)
    data = MarketData(np.ones((400, 2)), dates, ("A", "B"), "test")
    with pytest.raises(ConfigError, match=r"selection\.inner_days") as err:
        split_training_span(data, SelectionSettings(inner_days=150), EnvConfig(window=30))
    assert "env.episode_length" in str(err.value)


def test_selection_is_off_unless_asked_and_its_settings_are_checked() -> None:
    assert load_config(None).selection.enabled is False
    assert load_config(None).checkpoint_every == 0
    with pytest.raises(ConfigError, match=r"selection\.inner_fraction"):
        load_config(None, ["selection.inner_fraction=1.5"])
    with pytest.raises(ConfigError, match=r"selection\.metric"):
        load_config(None, ["selection.metric=luck"])
