"""Yardsticks for the learning tests beyond Sharpe: how fast a policy follows a known regime
change, and the simple rules a trained policy must beat on the same held-out days.

All of them are cheap backtests and bookkeeping on a finished ``TrainingRun`` or a config, no
training; ``RotationFilter`` is the rotating market's Bayes filter, the reference its
momentum bar is read against.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from allocator.trainer.market.data import MarketData
from allocator.trainer.sim.backtest import BacktestResult, run_backtest
from allocator.trainer.sim.baselines import DecisionContext, Policy
from allocator.trainer.sim.rule_selection import MomentumChoice, select_momentum
from allocator.trainer.training.config import TrainConfig
from allocator.trainer.training.policy_eval import backtest_model
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
    choice = select_momentum(
        data,
        start,
        config.data.train_end,
        lookbacks=lookbacks,
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


class RotationFilter:
    """The Bayes filter of ``rotating_market``'s own model: a ceiling, not a baseline.

    It knows what no policy is told: the drift, the noise, how often the leader is redrawn and
    that the draw is uniform. Per day it updates the posterior over which asset leads (a hidden
    Markov model: at each close a new draw with probability ``1 / period``, Gaussian returns
    around the leader's and the others' drifts). It does not know the calendar of the draws,
    which no policy sees either. ``book="leader"`` holds the most probable leader, fully
    invested, as top-1 momentum does; ``book="posterior"`` holds each asset at its probability.
    A reference, not a strict bound: it makes the best guess of the leader, not the best trade
    net of costs, so a policy that trades less can beat it on a draw.
    """

    def __init__(
        self,
        n_assets: int = 4,
        period: int = 20,
        drift: float = 0.004,
        vol: float = 0.006,
        book: str = "leader",
    ) -> None:
        if book not in ("leader", "posterior"):
            raise ValueError(f"book must be 'leader' or 'posterior', got {book!r}")
        self.name = f"rotation-filter-{book}"
        self.book = book
        self.means = np.full((n_assets, n_assets), -drift / (n_assets - 1))
        np.fill_diagonal(self.means, drift)
        redraw = 1.0 / period
        self.transition = np.full((n_assets, n_assets), redraw / n_assets)
        self.transition += np.eye(n_assets) * (1.0 - redraw)
        self.var = vol**2
        self.reset()

    def reset(self) -> None:
        """Forget every close: a uniform posterior, as before the first return."""
        n_assets = self.means.shape[0]
        self.posterior = np.full(n_assets, 1.0 / n_assets)
        self.seen = 1  # closes already folded into the posterior

    def update(self, prices: NDArray[np.float64]) -> NDArray[np.float64]:
        """Fold the closes not seen yet into the posterior (oldest first) and return it."""
        if len(prices) < self.seen:  # a shorter history is another one: start again
            self.reset()
        returns = np.diff(np.log(prices[self.seen - 1 :]), axis=0)
        for r in returns:
            loglik = -((r - self.means) ** 2).sum(axis=1) / (2 * self.var)
            joint = (self.posterior @ self.transition) * np.exp(loglik - loglik.max())
            self.posterior = joint / joint.sum()
        self.seen = len(prices)
        return self.posterior

    def __call__(self, ctx: DecisionContext) -> NDArray[np.float64]:
        if ctx.step == 0:  # a backtest's first decision: its whole history, from scratch
            self.reset()
        posterior = self.update(ctx.prices)
        if self.book == "posterior":
            return ctx.slot_weights(posterior)
        held = np.zeros_like(posterior)
        held[np.argmax(posterior)] = 1.0
        return ctx.slot_weights(held)


class _Member(Protocol):
    """A trained run just after training (``TrainingRun``) or read back (``LoadedRun``)."""

    @property
    def model(self) -> Any: ...


class SeedEnsemble:
    """The members' deterministic actions averaged: the rule an exported seed ensemble serves
    (``export.ensemble``), with the ``predict`` of one SB3 model."""

    def __init__(self, runs: Sequence[_Member]) -> None:
        if not runs:
            raise ValueError("an ensemble needs at least one member")
        self.models = [run.model for run in runs]

    def predict(self, obs: np.ndarray, deterministic: bool = True) -> tuple[np.ndarray, None]:
        actions = [m.predict(obs, deterministic=deterministic)[0] for m in self.models]
        return np.mean(actions, axis=0), None


def held_out_ensemble(runs: Sequence[TrainingRun], data: MarketData) -> BacktestResult:
    """The seed ensemble of ``runs`` (same config but the seed) on their held-out days, with
    their representation, costs and smoothing, as each member's own validation backtest."""
    first = runs[0]
    span = (first.config.data.validation_start, first.config.data.validation_end)
    result, _ = backtest_model(
        SeedEnsemble(runs),  # type: ignore[arg-type]
        first.config,
        data,
        span,
        first.stats,
        first.feature_norm,
    )
    return result
