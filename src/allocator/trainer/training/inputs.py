"""What a run learns from: the data cut into spans, and statistics fitted on the part it trains
on (with selection, the inner span must be as unseen as the validation span)."""

from __future__ import annotations

from dataclasses import dataclass

from stable_baselines3.common.monitor import Monitor

from allocator.portfolio import (
    FeatureNormalization,
    NormalizationStats,
    fit_feature_normalization,
    fit_normalization,
)
from allocator.trainer.market.data import MarketData, load_dataset
from allocator.trainer.sim.backtest import backtest_span
from allocator.trainer.sim.env import PortfolioEnv
from allocator.trainer.training.config import TrainConfig
from allocator.trainer.training.selection import InnerSplit, split_training_span
from allocator.typed_config import ConfigError


def restrict_universe(config: TrainConfig, data: MarketData) -> MarketData:
    """The configured assets (``data.assets``), refused when more than the slots hold."""
    if config.data.assets:
        if len(config.data.assets) > config.env.max_assets:
            raise ConfigError(
                f"data.assets lists {len(config.data.assets)} assets but env.max_assets is "
                f"{config.env.max_assets}"
            )
        return data.select(config.data.assets)
    return data


@dataclass(frozen=True)
class TrainingData:
    """The prices of a run and the statistics fitted on the part the model learns from."""

    data: MarketData  # the universe over every date: the validation backtest reads it
    train: MarketData  # the training span; the inner backtest reads only this
    fit: MarketData  # what the environment trains on: the training span, or its first part
    split: InnerSplit | None  # where selection cut the training span (None: no selection)
    stats: NormalizationStats
    feature_norm: FeatureNormalization | None


def prepare_data(config: TrainConfig) -> TrainingData:
    """Load and cut the data; fit the normalization on the part the model trains on only."""
    data = restrict_universe(config, load_dataset(config.data.dataset, as_of=config.data.as_of))
    train_data = data.between(config.data.train_start, config.data.train_end)
    split = None
    fit = train_data
    if config.selection.enabled:
        split = split_training_span(train_data, config.selection, config.env)
        fit = train_data.between(None, split.fit_end)
        backtest_span(train_data, split.inner_start, split.inner_end, None, config.env.history)
    stats = fit_normalization(fit.prices, axis=0)
    feature_norm = None
    if config.env.features == "asset_v1":
        feature_norm = fit_feature_normalization(fit.prices, config.env.asset_feature_spec)
    return TrainingData(data, train_data, fit, split, stats, feature_norm)


def make_env(config: TrainConfig, data: TrainingData) -> Monitor:
    """The training environment, on the fit part of the prices only."""
    env = PortfolioEnv(data.fit, config.env, stats=data.stats, feature_norm=data.feature_norm)
    return Monitor(env)
