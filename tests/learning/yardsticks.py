"""Yardsticks for the learning tests beyond Sharpe: how fast a policy follows a known regime
change, and the simple rules a trained policy must beat on the same held-out days.

All of them reuse a finished ``TrainingRun``: cheap backtests and bookkeeping, no training.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from allocator.trainer.market.data import MarketData
from allocator.trainer.sim.backtest import BacktestResult, run_backtest
from allocator.trainer.sim.baselines import DecisionContext
from allocator.trainer.sim.rule_selection import MomentumChoice, select_momentum
from allocator.trainer.training.run import TrainingRun


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


class AnchorPolicy:
    """The tilt mapping's anchor itself: a zero action maps to it bit for bit."""

    name = "anchor"

    def __call__(self, ctx: DecisionContext) -> NDArray[np.float64]:
        # run_backtest always passes the environment's mapping.
        assert ctx.to_weights is not None
        return ctx.to_weights(np.zeros(ctx.n_slots, dtype=np.float32))


def held_out_anchor(run: TrainingRun, data: MarketData) -> BacktestResult:
    """The run's anchor on its validation days, assets, costs, smoothing and representation.

    What the tilt policy holds with a zero action: the configured anchor (kind, cash share)
    computed from each decision's own prices, traded under the same costs and EMA smoothing.
    """
    env = run.config.env
    if env.action.mapping != "tilt":
        raise ValueError(f"the run maps actions with {env.action.mapping!r}: it has no anchor")
    agent = run.validation[run.config.algorithm.name]
    return run_backtest(
        AnchorPolicy(),
        data,
        start=run.config.data.validation_start,
        end=run.config.data.validation_end,
        assets=agent.settings["assets"],
        cost_bps=env.cost_bps,
        beta=env.beta,
        max_assets=env.max_assets,
        stats=run.stats,
        env_config=env,
        feature_norm=run.feature_norm,
    )


def held_out_momentum(
    run: TrainingRun,
    data: MarketData,
    lookbacks: tuple[int, ...] = (5, 10, 20, 40),
    ks: tuple[int, ...] = (1, 2),
) -> tuple[MomentumChoice, BacktestResult]:
    """The best top-k momentum rule, chosen on the run's training span, on its held-out days.

    The selection span ends at ``train_end`` and starts at ``train_start`` or, when fewer than
    ``max(lookbacks)`` closes precede it, at the first date with that many: the held-out days
    never take part in the choice.
    """
    cfg, env = run.config, run.config.env
    assets = run.validation[cfg.algorithm.name].settings["assets"]
    start = max(pd.Timestamp(cfg.data.train_start), data.dates[max(lookbacks)])
    choice = select_momentum(
        data,
        start,
        cfg.data.train_end,
        lookbacks=lookbacks,
        ks=ks,
        cost_bps=env.cost_bps,
        beta=env.beta,
        assets=assets,
    )
    result = run_backtest(
        choice.rule,
        data,
        start=cfg.data.validation_start,
        end=cfg.data.validation_end,
        assets=assets,
        cost_bps=env.cost_bps,
        beta=env.beta,
        window=env.window,
    )
    return choice, result
