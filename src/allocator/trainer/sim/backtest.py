"""Backtests: any policy over a date range through ``PortfolioEnv`` itself, so a backtest and
a training episode can never disagree about what a decision earned."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from allocator.portfolio import (
    FeatureNormalization,
    NormalizationStats,
    fit_feature_normalization,
    fit_normalization,
)
from allocator.trainer.market.data import DataError, DateLike, MarketData
from allocator.trainer.sim.baselines import DecisionContext, Policy, make_baseline
from allocator.trainer.sim.env import EnvConfig, PortfolioEnv
from allocator.trainer.sim.performance import performance

PolicyLike = Policy | Callable[[DecisionContext], NDArray[np.float64]] | str


@dataclass
class BacktestResult:
    """Daily NAV, returns, weights (raw and executed), turnover and costs of one run."""

    name: str
    nav: pd.Series  # indexed by date, first entry = initial value at the start date
    raw_weights: pd.DataFrame  # per decision date, columns cash + assets
    executed_weights: pd.DataFrame
    turnover: pd.Series
    costs: pd.Series
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def returns(self) -> pd.Series:
        """Daily net returns, indexed by the date each return is realised."""
        return self.nav.pct_change().iloc[1:]

    def metrics(self) -> dict[str, float]:
        return performance(
            self.returns.to_numpy(),
            self.turnover.to_numpy(),
            self.costs.to_numpy(),
            initial_value=float(self.nav.iloc[0]),
        )

    def allocation_summary(self) -> dict[str, Any]:
        """Daily turnover and each holding's weight range: a frozen book shows at a glance."""
        ranges = self.executed_weights.agg(["min", "mean", "max"])
        return {
            "mean_daily_turnover": float(self.turnover.mean()),
            "median_daily_turnover": float(self.turnover.median()),
            "weights": {str(c): {k: float(v) for k, v in ranges[c].items()} for c in ranges},
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: metrics at the top level, plus settings and the NAV path."""
        out: dict[str, Any] = {"policy": self.name, **self.metrics()}
        out["start"] = str(self.nav.index[0].date())
        out["end"] = str(self.nav.index[-1].date())
        out["settings"] = self.settings
        out["nav"] = {str(d.date()): float(v) for d, v in self.nav.items()}
        return out


def default_assets(data: MarketData, first: int, last: int) -> list[str]:
    """Assets with a close on every date from ``first`` to ``last`` (row indices)."""
    ok = (data.first_valid() <= first) & (data.last_valid() >= last)
    return [a for a, keep in zip(data.assets, ok, strict=True) if keep]


def backtest_span(
    data: MarketData,
    start: DateLike | None,
    end: DateLike | None,
    assets: Sequence[str] | None,
    window: int,
) -> tuple[int, int, list[str]]:
    """First and last decision row and the assets of a backtest, or a ``DataError`` on why not."""
    t0 = window if start is None else data.date_index(start, "left")
    t1 = data.n_dates - 1 if end is None else data.date_index(end, "right")
    if t0 < window:
        first_ok = data.dates[min(window, data.n_dates - 1)].date()
        raise DataError(
            f"{data.source}: start {pd.Timestamp(start).date() if start else ''} needs {window} "
            f"closes before it; the earliest possible start is {first_ok}"
        )
    if t1 - t0 < 2:
        raise DataError(f"{data.source}: fewer than 3 dates between {start} and {end}")
    listed = default_assets(data, t0 - window, t1)
    names = list(assets) if assets else listed
    if not names:
        raise DataError(f"{data.source}: no asset has prices over the whole backtest")
    data.select(names)  # unknown or repeated ids fail here, naming them
    short = [a for a in names if a not in listed]
    if short:
        raise DataError(
            f"{data.source}: asset(s) {', '.join(short)} lack prices between "
            f"{data.dates[t0 - window].date()} and {data.dates[t1].date()}"
        )
    return t0, t1, names


def _backtest_env(
    data: MarketData,
    base: EnvConfig,
    settings: dict[str, Any],
    names: list[str],
    t0: int,
    stats: NormalizationStats | None,
    feature_norm: FeatureNormalization | None,
) -> PortfolioEnv:
    """The backtest's environment; statistics not given are fitted on the data before ``t0``."""
    seen = data.prices[: t0 + 1][:, [data.assets.index(a) for a in names]]
    if stats is None:
        stats = fit_normalization(seen)
    if feature_norm is None and base.features == "asset_v1":
        feature_norm = fit_feature_normalization(seen, base.asset_feature_spec)
    config = EnvConfig(**base.model_dump() | settings)
    return PortfolioEnv(data, config, stats=stats, feature_norm=feature_norm)


def run_backtest(
    policy: PolicyLike,
    data: MarketData,
    start: DateLike | None = None,
    end: DateLike | None = None,
    assets: Sequence[str] | None = None,
    cost_bps: float = 10.0,
    beta: float = 0.0,
    window: int = 30,
    max_assets: int | None = None,
    initial_value: float = 1.0,
    stats: NormalizationStats | None = None,
    env_config: EnvConfig | None = None,
    feature_norm: FeatureNormalization | None = None,
) -> BacktestResult:
    """Run ``policy`` deciding at every close from ``start`` until the day before ``end``;
    ``env_config`` gives a trained policy's representation (and ``window``)."""
    if isinstance(policy, str):
        name, pol = policy, make_baseline(policy)
    else:
        name = str(getattr(policy, "name", getattr(policy, "__name__", type(policy).__name__)))
        pol = policy
    base = env_config or EnvConfig(window=window)
    t0, t1, names = backtest_span(data, start, end, assets, base.history)
    m = max(len(names), max_assets or 0)
    settings = {
        "max_assets": m,
        "min_assets": 1,
        "episode_length": t1 - t0,
        "cost_bps": cost_bps,
        "beta": beta,
        "initial_value": initial_value,
    }
    env = _backtest_env(data, base, settings, names, t0, stats, feature_norm)
    obs, _ = env.reset(options={"assets": names, "start": t0, "episode_length": t1 - t0})
    prices = data.prices[:, env.asset_index]
    n = t1 - t0
    raw = np.empty((n, env.n_slots))
    executed = np.empty((n, env.n_slots))
    turnover, costs, nav = np.empty(n), np.empty(n), np.empty(n + 1)
    nav[0] = initial_value
    for k in range(n):
        t = t0 + k
        ctx = DecisionContext(
            date=data.dates[t],
            step=k,
            assets=env.asset_names,
            prices=prices[: t + 1],
            weights=env.drifted.copy(),
            mask=env.mask.copy(),
            observation=obs,
            to_weights=env.action_weights,
        )
        obs, _, _, _, info = env.step_weights(pol(ctx))
        raw[k], executed[k] = info["raw_weights"], info["executed_weights"]
        turnover[k], costs[k], nav[k + 1] = info["turnover"], info["cost"], info["nav"]
    columns = ["cash", *env.asset_names, *[f"empty{i}" for i in range(m - len(names))]]
    decision_dates = data.dates[t0:t1]
    return BacktestResult(
        name=name,
        nav=pd.Series(nav, index=data.dates[t0 : t1 + 1], name=name),
        raw_weights=pd.DataFrame(raw, index=decision_dates, columns=columns),
        executed_weights=pd.DataFrame(executed, index=decision_dates, columns=columns),
        turnover=pd.Series(turnover, index=decision_dates),
        costs=pd.Series(costs, index=decision_dates),
        settings={
            "assets": names,
            "cost_bps": cost_bps,
            "beta": beta,
            "window": base.window,
            "initial_value": initial_value,
            "dataset": data.source,
        },
    )
