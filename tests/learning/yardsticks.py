"""Yardsticks for the learning tests beyond Sharpe: how fast a policy follows a known regime
change, and the simple rules a trained policy must beat on the same held-out days.

All of them are cheap backtests and bookkeeping on a finished ``TrainingRun`` or a config, no
training; ``RotationFilter`` (``allocator.trainer.sim.ceilings``, re-exported here) is the
rotating market's Bayes filter, the reference its momentum bar is read against.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pandas as pd

from allocator.trainer.jobs.suite.job import held_out
from allocator.trainer.market.data import MarketData
from allocator.trainer.sim.backtest import BacktestResult, run_backtest
from allocator.trainer.sim.baselines import AnchorPolicy, Policy
from allocator.trainer.sim.ceilings import RotationFilter
from allocator.trainer.sim.rule_selection import MomentumChoice, select_simple_rule
from allocator.trainer.training.config import TrainConfig
from allocator.trainer.training.run import TrainingRun

__all__ = [
    "AnchorPolicy",
    "RotationFilter",
    "held_out_anchor",
    "held_out_momentum",
    "held_out_rule",
    "momentum_for",
    "regime_switch_lag",
    "switch_lags",
]


def switch_lags(executed_weights: pd.DataFrame, leader_per_day: pd.Series) -> list[int]:
    """Per regime change inside the backtest: decisions until the largest holding is the leader.

    ``executed_weights`` are indexed by decision date (columns ``cash`` and the assets, as in a
    ``BacktestResult``); ``leader_per_day`` names, per market date, the asset whose drift drives
    the return realised at that date's close, and must cover the day after every decision. A
    decision earns the next day's return, so its target is the next day's leader; a regime
    starts at the first decision whose target differs from the one before. The lag is the
    number of decisions from there until the largest asset weight (cash excluded) is the new
    leader: 0 only when the book moved before any evidence, 1 for a policy that follows the
    first close of the new regime. A regime the book never follows counts its full length (the
    last one, its length inside the backtest). Regimes already running at the first decision
    are not changes.
    """
    after = leader_per_day.shift(-1).reindex(executed_weights.index)
    if after.isna().any():
        missing = after.index[after.isna()][0].date()
        raise ValueError(f"leader_per_day has no leader for the day after {missing}")
    target = after.to_numpy()
    assets = executed_weights.drop(columns="cash")
    held = np.where(assets.max(axis=1) > 0, assets.idxmax(axis=1), None)
    starts = [i for i in range(1, len(target)) if target[i] != target[i - 1]]
    bounds = [*starts, len(target)]
    lags = []
    for start, end in itertools.pairwise(bounds):
        hits = np.flatnonzero(held[start:end] == target[start])
        lags.append(int(hits[0]) if hits.size else end - start)
    return lags


def regime_switch_lag(executed_weights: pd.DataFrame, leader_per_day: pd.Series) -> float:
    """The mean of ``switch_lags``: decisions a policy needs to follow a new leader."""
    lags = switch_lags(executed_weights, leader_per_day)
    if not lags:
        raise ValueError("no regime change between the first and the last decision")
    return float(np.mean(lags))


def held_out_anchor(run: TrainingRun, data: MarketData) -> BacktestResult:
    """The run's anchor on its validation days, assets, costs, smoothing and representation.

    What the tilt policy holds with a zero action: the configured anchor (kind, cash share)
    computed from each decision's own prices, traded under the same costs and EMA smoothing.
    """
    env = run.config.env
    if env.action.mapping != "tilt":
        raise ValueError(f"the run maps actions with {env.action.mapping!r}: it has no anchor")
    return held_out(run, data, AnchorPolicy())


def held_out_momentum(
    run: TrainingRun,
    data: MarketData,
    lookbacks: tuple[int, ...] = (5, 10, 20, 40),
    ks: tuple[int, ...] = (1, 2),
) -> tuple[MomentumChoice, BacktestResult]:
    """The best top-k momentum rule, chosen on the run's training span, on its held-out days."""
    assets = run.validation[run.config.algorithm.name].settings["assets"]
    return momentum_for(run.config, data, assets, lookbacks, ks)


def momentum_for(
    config: TrainConfig,
    data: MarketData,
    assets: Sequence[str],
    lookbacks: tuple[int, ...] = (5, 10, 20, 40),
    ks: tuple[int, ...] = (1, 2),
) -> tuple[MomentumChoice, BacktestResult]:
    """The best top-k momentum rule chosen on ``config``'s training span, on its held-out days.

    The selection span ends at ``train_end`` and starts at ``train_start`` or, when fewer than
    ``max(lookbacks)`` closes precede it, at the first date with that many: the held-out days
    never take part in the choice.
    """
    start = max(pd.Timestamp(config.data.train_start), data.dates[max(lookbacks)])
    choice = select_simple_rule(
        data,
        start,
        config.data.train_end,
        momentum_lookbacks=lookbacks,
        reversal_lookbacks=(),
        ks=ks,
        cost_bps=config.env.cost_bps,
        beta=config.env.beta,
        assets=list(assets),
    )
    return choice, held_out_rule(config, data, assets, choice.rule)


def held_out_rule(
    config: TrainConfig, data: MarketData, assets: Sequence[str], rule: Policy
) -> BacktestResult:
    """A weights rule on ``config``'s held-out days, with its costs and smoothing."""
    env = config.env
    return run_backtest(
        rule,
        data,
        start=config.data.validation_start,
        end=config.data.validation_end,
        assets=list(assets),
        cost_bps=env.cost_bps,
        beta=env.beta,
        window=env.window,
    )
