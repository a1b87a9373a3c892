"""What a run learns from: the data cut into spans, and statistics fitted on the part it trains
on (with selection, the inner span must be as unseen as the validation span)."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from typing import Any

from stable_baselines3.common.monitor import Monitor

from allocator.portfolio import (
    FeatureNormalization,
    NormalizationStats,
    fit_feature_normalization,
    fit_normalization,
)
from allocator.trainer.market.data import MarketData, load_dataset
from allocator.trainer.sim.backtest import backtest_span
from allocator.trainer.sim.env import EnvConfig, PortfolioEnv
from allocator.trainer.training.config import SelectionSettings, TrainConfig
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
class InnerSplit:
    """Where the training span is cut: the model learns up to ``fit_end``, is judged after."""

    fit_end: dt.date
    inner_start: dt.date
    inner_end: dt.date
    purge_days: int
    fit_days: int
    inner_days: int

    def to_dict(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, dt.date) else v for k, v in asdict(self).items()}


def split_training_span(
    train_data: MarketData, settings: SelectionSettings, env: EnvConfig
) -> InnerSplit:
    """Cut ``train_data``'s trading days into training part, purge gap and inner span; refused
    when the training part could not hold one episode with its observation window."""
    dates = train_data.dates
    n = len(dates)
    inner = settings.inner_days or round(settings.inner_fraction * n)  # inner_days >= 5 if set
    fit_days = n - inner - settings.purge_days
    need = env.history + env.episode_length + 1
    if inner < 5 or fit_days < need:
        raise ConfigError(
            f"selection: the training span has {n} trading days; an inner span of {inner} "
            f"(selection.inner_days/inner_fraction, at least 5) and a purge of "
            f"{settings.purge_days} leave {fit_days} to train on, and the environment needs "
            f"{need} (history {env.history} + env.episode_length {env.episode_length} + 1)"
        )
    return InnerSplit(
        fit_end=dates[fit_days - 1].date(),
        inner_start=dates[n - inner].date(),
        inner_end=dates[-1].date(),
        purge_days=settings.purge_days,
        fit_days=fit_days,
        inner_days=inner,
    )


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
