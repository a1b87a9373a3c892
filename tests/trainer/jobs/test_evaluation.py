"""Out-of-sample evaluation: the exported model through the serving path as a ``BacktestResult``
that matches the torch policy in the backtest environment, and baselines on the same terms that
never see the test period."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from allocator.trainer.export.run import export_run
from allocator.trainer.jobs.evaluation import (
    DEFAULT_BASELINES,
    evaluate_baselines,
    evaluation_assets,
    fit_baseline_weights,
    icm_statistics,
    replay_exported,
)
from allocator.trainer.market.data import DataError, MarketData, load_sp500
from allocator.trainer.sim.backtest import run_backtest
from allocator.trainer.sim.baselines import ActionPolicy
from allocator.trainer.training.config import load_config
from allocator.trainer.training.run import TrainingRun, train
from tests.trainer.tiny import TINY_TRAINING

UNIVERSE = ["AAPL", "MSFT", "JPM", "XOM"]
TRAIN = ("2017-01-01", "2017-12-31")
TEST = ("2018-01-01", "2018-03-31")
TINY = [
    f"data.assets=[{','.join(UNIVERSE)}]",
    f"data.train_start={TRAIN[0]}",
    f"data.train_end={TRAIN[1]}",
    f"data.validation_start={TEST[0]}",
    f"data.validation_end={TEST[1]}",
    "env.max_assets=4",
    "env.beta=0.5",
    *TINY_TRAINING,
]


@dataclass
class Exported:
    run: TrainingRun
    version_dir: Path
    data: MarketData


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    """A tiny TD3 trained on 2017 and exported to a registry, once for the module."""
    root = tmp_path_factory.mktemp("evaluation")
    run = train(load_config(None, [*TINY, f"output_dir={root}"]), root / "run")
    version_dir = export_run(run.run_dir, root / "models", name="tiny", version="1")
    return Exported(run, version_dir, load_sp500().select(UNIVERSE))


def test_the_exported_model_replays_like_the_torch_policy(exported: Exported) -> None:
    """Serving path (onnxruntime, slots, smoothing state) == torch actor in ``PortfolioEnv``,
    with one slot left empty (3 assets for 4 slots)."""
    assets = ["MSFT", "XOM", "AAPL"]
    result = replay_exported(
        exported.version_dir, exported.data, *TEST, cost_bps=10, assets=assets
    ).result
    model = exported.run.model

    def actor(obs: np.ndarray) -> np.ndarray:
        return model.predict(obs, deterministic=True)[0]

    reference = run_backtest(
        ActionPolicy(actor, name="torch"),
        exported.data,
        *TEST,
        assets=assets,
        cost_bps=10,
        beta=0.5,
        window=10,
        max_assets=4,
        stats=exported.run.stats,
    )
    columns = ["cash", *assets]
    assert list(result.raw_weights.columns) == columns
    assert result.nav.index.equals(reference.nav.index)
    assert result.raw_weights.index.equals(reference.raw_weights.index)
    np.testing.assert_allclose(result.raw_weights, reference.raw_weights[columns], atol=1e-5)
    np.testing.assert_allclose(
        result.executed_weights, reference.executed_weights[columns], atol=1e-5
    )
    np.testing.assert_allclose(result.turnover, reference.turnover, atol=1e-5)
    np.testing.assert_allclose(result.nav, reference.nav, rtol=1e-5)
    assert result.metrics()["sharpe"] == pytest.approx(reference.metrics()["sharpe"], abs=1e-3)
    # Smoothing made a difference, and the metrics are complete.
    assert np.abs(result.raw_weights - result.executed_weights).to_numpy().max() > 1e-4
    assert set(result.metrics()) == set(reference.metrics())
    assert result.settings["version"] == "1"
    assert result.settings["beta"] == 0.5


def test_default_assets_fill_the_model_slots_and_icm_is_absent(exported: Exported) -> None:
    ev = replay_exported(exported.version_dir, exported.data, *TEST, cost_bps=10)
    assert ev.result.settings["assets"] == UNIVERSE  # every asset priced over the span
    assert ev.icm_rewards.isna().all()  # a model without ICM
    assert icm_statistics(ev.icm_rewards) is None


def test_too_many_assets_for_the_model_are_refused(exported: Exported) -> None:
    data = load_sp500()
    with pytest.raises(DataError, match="has 4 slots"):
        replay_exported(
            exported.version_dir, data, *TEST, cost_bps=10, assets=list(data.assets[:5])
        )
    with pytest.raises(DataError, match="needs 10 closes before it"):
        evaluation_assets(data, data.dates[3], data.dates[50], window=10)


def test_baselines_run_on_the_same_span_assets_and_costs(exported: Exported) -> None:
    assets = ["AAPL", "JPM", "XOM"]
    agent = replay_exported(
        exported.version_dir, exported.data, *TEST, cost_bps=25, assets=assets
    ).result
    baselines = evaluate_baselines(
        exported.data,
        *TEST,
        cost_bps=25,
        assets=assets,
        train_start=TRAIN[0],
        train_end=TRAIN[1],
        window=10,
    )
    assert list(baselines) == list(DEFAULT_BASELINES)
    for name, result in baselines.items():
        assert result.name == name
        assert result.nav.index.equals(agent.nav.index)
        assert result.settings["assets"] == assets
        assert result.settings["cost_bps"] == 25
        assert list(result.executed_weights.columns) == ["cash", *assets]
    equal = run_backtest(
        "equal-weight", exported.data, *TEST, assets=assets, cost_bps=25, window=10
    )
    pd.testing.assert_series_equal(baselines["equal-weight"].nav, equal.nav, check_names=False)
    assert baselines["buy-and-hold"].turnover.iloc[1:].abs().max() < 1e-12
    assert baselines["min-variance"].settings["fit"] == "train"


def shocked(data: MarketData, after: str, seed: int) -> MarketData:
    """The same prices up to ``after``; random extra moves from the next day on."""
    prices = data.prices.copy()
    t = data.date_index(after, "right") + 1
    rng = np.random.default_rng(seed)
    moves = np.exp(np.cumsum(rng.normal(0, 0.03, size=prices[t:].shape), axis=0))
    prices[t:] *= moves
    return MarketData(prices, data.dates, data.assets, data.source)


@pytest.mark.parametrize("name", ["min-variance", "hrp"])
def test_fitted_baselines_see_only_the_training_span(exported: Exported, name: str) -> None:
    data = exported.data
    fitted = fit_baseline_weights(name, data, UNIVERSE, *TRAIN)
    assert sum(fitted.values()) == pytest.approx(1.0)
    # Anything after the training span (the purge gap, the test) does not move the fit ...
    assert fit_baseline_weights(name, shocked(data, TRAIN[1], 1), UNIVERSE, *TRAIN) == fitted
    # ... while the training span does.
    moved = fit_baseline_weights(name, shocked(data, "2017-06-30", 2), UNIVERSE, *TRAIN)
    assert max(abs(moved[a] - fitted[a]) for a in UNIVERSE) > 1e-3

    def first_weights(d: MarketData, fit: str) -> np.ndarray:
        (result,) = evaluate_baselines(
            d, *TEST, cost_bps=10, assets=UNIVERSE, names=[name], fit=fit,
            train_start=TRAIN[0], train_end=TRAIN[1], window=10,
        ).values()  # fmt: skip
        return result.executed_weights.iloc[0].to_numpy()

    # The first test decision (close of 2018-01-02) holds the training fit; what follows it
    # cannot change it.
    first = "2018-01-02"
    target = first_weights(data, "train")
    np.testing.assert_allclose(target[1:], [fitted[a] for a in UNIVERSE], atol=1e-12)
    np.testing.assert_allclose(first_weights(shocked(data, first, 3), "train"), target)
    # Trailing refits use the 252 days up to each decision: causal too, but not the same fit.
    trailing = first_weights(data, "trailing")
    assert np.abs(trailing - target).max() > 1e-3
    np.testing.assert_allclose(first_weights(shocked(data, first, 4), "trailing"), trailing)


def test_a_training_span_reaching_into_the_test_is_refused(exported: Exported) -> None:
    with pytest.raises(ValueError, match="would see the test period"):
        evaluate_baselines(
            exported.data, *TEST, cost_bps=10, assets=UNIVERSE,
            train_start=TRAIN[0], train_end=TEST[0], window=10,
        )  # fmt: skip
    with pytest.raises(ValueError, match="needs train_start and train_end"):
        evaluate_baselines(exported.data, *TEST, cost_bps=10, assets=UNIVERSE, window=10)


def test_icm_statistics_skip_missing_rewards_and_compare_with_a_reference() -> None:
    rewards = pd.Series([np.nan, 1.0, 2.0, 3.0, 6.0])
    stats = icm_statistics(rewards, reference=np.array([np.nan, 1.0, 2.0]))
    assert stats is not None
    assert stats["count"] == 4
    assert stats["mean"] == pytest.approx(3.0)
    assert stats["median"] == pytest.approx(2.5)
    assert stats["max"] == 6.0
    assert stats["reference_mean"] == pytest.approx(1.5)
    assert stats["novelty_ratio"] == pytest.approx(2.0)
    assert icm_statistics(np.array([np.nan, np.nan])) is None
