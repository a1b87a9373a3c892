"""Backtests of a trained policy: the validation span after training, the inner span during it.

Both go through the same code so a checkpoint is chosen on exactly the figures (costs, smoothing,
representation, training-span normalization) that the final validation reports.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
from stable_baselines3.common.base_class import BaseAlgorithm

from allocator.portfolio import FeatureNormalization, NormalizationStats
from allocator.trainer.market.data import MarketData
from allocator.trainer.sim.backtest import BacktestResult, default_assets, run_backtest
from allocator.trainer.sim.baselines import ANCHOR, ActionPolicy, Anchor
from allocator.trainer.statistics.sharpe import ExcessSharpe, excess_sharpe_interval
from allocator.trainer.training.config import TrainConfig


def backtest_model(
    model: BaseAlgorithm,
    config: TrainConfig,
    data: MarketData,
    span: tuple[dt.date, dt.date],
    stats: NormalizationStats,
    feature_norm: FeatureNormalization | None = None,
) -> tuple[BacktestResult, np.ndarray]:
    """The deterministic policy over ``span`` of ``data``, with the run's costs and smoothing.

    Returns the backtest and the actions the policy took. Only ``data`` is read, so a caller
    that must not see some dates passes data that ends before them.
    """
    env_cfg = config.env
    t0 = data.date_index(span[0], "left")
    t1 = data.date_index(span[1], "right")
    assets = default_assets(data, t0 - env_cfg.history, t1)[: env_cfg.max_assets]
    actions: list[np.ndarray] = []

    def actor(obs: np.ndarray) -> np.ndarray:
        action, _ = model.predict(obs, deterministic=True)
        actions.append(np.asarray(action))
        return action

    # The policy sees the representation it was trained with.
    result = run_backtest(
        ActionPolicy(actor, name=config.algorithm.name),
        data=data,
        start=span[0],
        end=span[1],
        assets=assets,
        cost_bps=env_cfg.cost_bps,
        window=env_cfg.window,
        beta=env_cfg.beta,
        max_assets=env_cfg.max_assets,
        stats=stats,
        env_config=None if env_cfg.is_default_representation else env_cfg,
        feature_norm=feature_norm,
    )
    return result, np.asarray(actions)


def validate_policy(
    model: BaseAlgorithm,
    config: TrainConfig,
    data: MarketData,
    stats: NormalizationStats,
    feature_norm: FeatureNormalization | None = None,
) -> tuple[dict[str, BacktestResult], np.ndarray]:
    """Backtest the deterministic policy, equal weight and HRP on the validation period, and a
    tilt policy's anchor (``anchor``).

    Equal weight is the bar a policy must clear net of costs; HRP (skfolio, refitted every 21
    days on trailing prices) is the strongest simple baseline in the walk-forward runs; the
    anchor is what a tilt policy holds at a zero action, so beating it is what the learning adds.
    """
    d = config.data
    span = (d.validation_start, d.validation_end)
    agent, actions = backtest_model(model, config, data, span, stats, feature_norm)
    common = {
        "data": data,
        "start": span[0],
        "end": span[1],
        "assets": agent.settings["assets"],
        "cost_bps": config.env.cost_bps,
        "beta": 0.0,
    }
    equal = run_backtest("equal-weight", window=config.env.window, **common)
    hrp = run_backtest("hrp", **common)
    out = {agent.name: agent, "equal-weight": equal, "hrp": hrp}
    spec = config.env.action.tilt_anchor
    if spec is not None:
        out[ANCHOR] = run_backtest(Anchor(spec), window=config.env.window, **common)
    return out, actions


def excess_over(
    validation: dict[str, BacktestResult], agent_name: str, benchmark: str, seed: int
) -> ExcessSharpe:
    """The agent's excess Sharpe over ``benchmark`` on the validation days, with its interval.

    One span of a few years puts a Sharpe within about half a unit of its truth, so the
    difference is reported with a stationary-bootstrap interval rather than as a bare number.
    """
    days = pd.concat(
        [validation[agent_name].returns, validation[benchmark].returns], axis=1, join="inner"
    )
    return excess_sharpe_interval(days.iloc[:, 0], days.iloc[:, 1], seed=seed)
