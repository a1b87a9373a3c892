"""Backtests of a trained policy, one path for the validation span and the inner span, so a
checkpoint is chosen on exactly the figures the final validation reports."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import pandas as pd
from stable_baselines3.common.base_class import BaseAlgorithm

from allocator.portfolio import FeatureNormalization, NormalizationStats
from allocator.trainer.market.data import MarketData
from allocator.trainer.sim.backtest import BacktestResult, backtest_span, run_backtest
from allocator.trainer.sim.baselines import ANCHOR, ActionPolicy, Anchor
from allocator.trainer.statistics.sharpe import ExcessSharpe, excess_sharpe_interval
from allocator.trainer.training.config import TrainConfig


class Actor(Protocol):
    """What a backtest asks of a policy: SB3's ``predict``."""

    def predict(self, observation: Any, *, deterministic: bool = ...) -> tuple[Any, Any]: ...


class ActionRule:
    """A policy a backtest can run without SB3: its ``predict`` calls ``act``."""

    def act(self, observation: Any) -> np.ndarray:
        raise NotImplementedError

    def predict(
        self,
        observation: Any,
        state: Any = None,
        episode_start: Any = None,
        deterministic: bool = True,
    ) -> tuple[np.ndarray, None]:
        return self.act(observation), None


class SeedEnsemble(ActionRule):
    """The mean of several runs' deterministic actions: the rule an exported seed ensemble
    serves (``export.run.export_runs``)."""

    def __init__(self, models: Sequence[Actor]) -> None:
        if not models:
            raise ValueError("an ensemble needs at least one member")
        self.models = list(models)

    def act(self, observation: Any) -> np.ndarray:
        actions = [m.predict(observation, deterministic=True)[0] for m in self.models]
        return np.asarray(np.mean(actions, axis=0))


class ZeroAction(ActionRule):
    """The policy whose action is always 0: under the tilt mapping, its anchor."""

    def __init__(self, shape: tuple[int, ...] | None) -> None:
        self.action = np.zeros(shape or (), dtype=np.float32)

    def act(self, observation: Any) -> np.ndarray:
        return self.action.copy()


def backtest_model(
    model: Actor,
    config: TrainConfig,
    data: MarketData,
    span: tuple[dt.date, dt.date],
    stats: NormalizationStats,
    feature_norm: FeatureNormalization | None = None,
) -> tuple[BacktestResult, np.ndarray]:
    """The deterministic policy over ``span`` of ``data`` (only ``data`` is read), with the
    run's costs and smoothing: the backtest and the actions taken."""
    env_cfg = config.env
    assets = backtest_span(data, *span, None, env_cfg.history)[2][: env_cfg.max_assets]
    actions: list[np.ndarray] = []

    def actor(obs: np.ndarray) -> np.ndarray:
        action, _ = model.predict(obs, deterministic=True)
        actions.append(np.asarray(action))
        return action

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
    """The policy, equal weight, HRP (the strongest simple baseline) and a tilt's anchor."""
    span = (config.data.validation_start, config.data.validation_end)
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
    out = {agent.name: agent, "equal-weight": equal, "hrp": run_backtest("hrp", **common)}
    spec = config.env.action.tilt_anchor
    if spec is not None:
        out[ANCHOR] = run_backtest(Anchor(spec), window=config.env.window, **common)
    return out, actions


def excess_over(
    validation: dict[str, BacktestResult], agent_name: str, benchmark: str, seed: int
) -> ExcessSharpe:
    """The agent's excess Sharpe over ``benchmark`` on the validation days, with a bootstrap
    interval (one span of a few years pins a Sharpe to about half a unit)."""
    days = pd.concat(
        [validation[agent_name].returns, validation[benchmark].returns], axis=1, join="inner"
    )
    return excess_sharpe_interval(days.iloc[:, 0], days.iloc[:, 1], seed=seed)
