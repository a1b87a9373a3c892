"""Out-of-sample evaluation: an exported model through the serving path, and the baselines, on the
same span, assets and costs.

Fitted baselines must not see the test period: with ``fit="train"`` they are fitted on the training
span and held as a constant mix (what the model knew when frozen); ``fit="trailing"`` refits on the
trailing 252 days at each rebalance (causal, but still learning during the test span)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from allocator.portfolio import AnchorSpec
from allocator.serving.loader import LoadedModel, load_model
from allocator.serving.replay import replay
from allocator.trainer.market.data import DataError, DateLike, MarketData
from allocator.trainer.sim.backtest import BacktestResult, backtest_span, run_backtest
from allocator.trainer.sim.baselines import ANCHOR, DecisionContext, Rebalancing, make_baseline

DEFAULT_BASELINES: tuple[str, ...] = ("equal-weight", "buy-and-hold", "min-variance", "hrp")
FITTED_BASELINES: frozenset[str] = frozenset({"min-variance", "hrp"})
BaselineFit = Literal["train", "trailing"]


def evaluation_assets(
    data: MarketData, start: DateLike, end: DateLike, window: int, max_assets: int | None = None
) -> list[str]:
    """Assets priced over the whole span and its observation window (at most ``max_assets``)."""
    names = backtest_span(data, start, end, None, window)[2]
    return names[:max_assets] if max_assets else names


@dataclass
class ExportedEvaluation:
    """A serving-path replay as a ``BacktestResult``, with the per-decision ICM."""

    result: BacktestResult
    icm_rewards: pd.Series  # NaN where the server gives none (first decision, no ICM)


def replay_exported(
    model: str | Path | LoadedModel,
    data: MarketData,
    start: DateLike,
    end: DateLike,
    *,
    cost_bps: float,
    assets: Sequence[str] | None = None,
    name: str | None = None,
) -> ExportedEvaluation:
    """Replay an exported model (a version directory or a ``LoadedModel``) on the dates
    ``run_backtest`` decides on; ``assets`` default to those priced over the whole span."""
    if not isinstance(model, LoadedModel):
        model = load_model(model, prefer_cuda=False)  # CPU: deterministic, like the tests
    window = model.manifest.feature_spec.window
    t0, t1, names = backtest_span(data, start, end, assets, window)
    if assets is None:
        names = names[: model.max_assets]
    if len(names) > model.max_assets:
        raise DataError(
            f"{len(names)} assets but model {model.name}/{model.version} has "
            f"{model.max_assets} slots; pass at most {model.max_assets}"
        )
    rep = replay(model, data.select(names).to_frame(), start=t0, end=t1, cost_bps=cost_bps)
    decision_dates = data.dates[t0:t1]
    columns = ["cash", *rep.assets]
    label = name or f"{model.name}/{model.version}"
    result = BacktestResult(
        name=label,
        nav=pd.Series(rep.nav, index=data.dates[t0 : t1 + 1], name=label),
        raw_weights=pd.DataFrame(rep.wide("raw_weights"), index=decision_dates, columns=columns),
        executed_weights=pd.DataFrame(
            rep.wide("smoothed_weights"), index=decision_dates, columns=columns
        ),
        turnover=pd.Series(rep.turnover, index=decision_dates),
        costs=pd.Series(rep.costs, index=decision_dates),
        settings={
            "assets": names,
            "cost_bps": float(cost_bps),
            "beta": float(model.manifest.beta),
            "window": window,
            "initial_value": 1.0,
            "dataset": data.source,
            "model": model.name,
            "version": model.version,
            "provider": model.provider,
            "path": "serving replay (onnxruntime)",
        },
    )
    icm = pd.Series(
        [np.nan if o.icm_reward is None else float(o.icm_reward) for o in rep.outputs],
        index=decision_dates,
        name="icm_reward",
    )
    return ExportedEvaluation(result, icm)


def icm_statistics(
    rewards: pd.Series | NDArray[np.float64],
    reference: pd.Series | NDArray[np.float64] | None = None,
) -> dict[str, float] | None:
    """Summary of a model's curiosity over a span (None when it has no ICM); ``reference``
    (data it learned on) gives ``novelty_ratio``."""

    def finite_part(values: Any) -> NDArray[np.float64]:
        a = np.asarray(values, dtype=np.float64)
        return a[np.isfinite(a)]

    r = finite_part(rewards)
    if r.size == 0:
        return None
    stats = {
        "count": float(r.size),
        "mean": float(r.mean()),
        "std": float(r.std(ddof=1)) if r.size > 1 else 0.0,
        "median": float(np.median(r)),
        "p95": float(np.quantile(r, 0.95)),
        "max": float(r.max()),
    }
    ref = finite_part([] if reference is None else reference)
    if ref.size:
        mean = float(ref.mean())
        stats["reference_mean"] = mean
        stats["novelty_ratio"] = stats["mean"] / mean if mean != 0 else float("nan")
    return stats


class ConstantMix(Rebalancing):
    """Fixed target weights per asset, traded back to every ``rebalance_every`` days."""

    def __init__(self, name: str, weights: dict[str, float], rebalance_every: int) -> None:
        super().__init__(rebalance_every)
        self.name, self.weights = name, weights

    def target(self, ctx: DecisionContext) -> NDArray[np.float64]:
        w = np.array([self.weights.get(a, 0.0) for a in ctx.assets], dtype=np.float64)
        if w.sum() <= 0:
            w = np.full(len(ctx.assets), 1.0 / len(ctx.assets))  # degenerate fit: 1/N
        return ctx.slot_weights(w)


def fit_baseline_weights(
    name: str, data: MarketData, assets: Sequence[str], train_start: DateLike, train_end: DateLike
) -> dict[str, float]:
    """Fit a skfolio baseline on the training span's days where every asset has a close (an
    asset listed late shortens the fit, never reaches past ``train_end``)."""
    span = data.select(list(assets))
    lo, hi = span.date_index(train_start, "left"), span.date_index(train_end, "right")
    prices = span.prices[lo : hi + 1]
    prices = prices[np.isfinite(prices).all(axis=1)]
    if len(prices) < 3:
        raise DataError(
            f"{data.source}: {name} needs at least 3 common closes of {', '.join(assets)} "
            f"between {train_start} and {train_end}"
        )
    model = make_baseline(name, lookback=len(prices), rebalance_every=1)
    weights = model.fit_weights(prices, tuple(assets))  # type: ignore[attr-defined]
    return {a: float(w) for a, w in zip(assets, weights, strict=True)}


def evaluate_baselines(
    data: MarketData,
    start: DateLike,
    end: DateLike,
    *,
    cost_bps: float,
    assets: Sequence[str] | None,
    names: Sequence[str] = DEFAULT_BASELINES,
    fit: BaselineFit = "train",
    train_start: DateLike | None = None,
    train_end: DateLike | None = None,
    window: int = 30,
    rebalance_every: int = 21,
    anchor: AnchorSpec | None = None,
) -> dict[str, BacktestResult]:
    """Backtest baselines over ``[start, end]`` with the same costs and assets as the model;
    fitted ones follow ``fit`` (module docstring), ``window`` sets the closes before ``start``."""
    names_ = list(assets) if assets is not None else evaluation_assets(data, start, end, window)
    if fit == "train" and any(n in FITTED_BASELINES for n in names):
        if train_start is None or train_end is None:
            raise ValueError("fit='train' needs train_start and train_end for fitted baselines")
        if pd.Timestamp(train_end) >= pd.Timestamp(start):
            raise ValueError(
                f"training span ends {train_end}, not before the test start {start}: "
                "a fitted baseline would see the test period"
            )
    out: dict[str, BacktestResult] = {}
    for name in names:
        policy: Any
        if name in FITTED_BASELINES and fit == "train":
            weights = fit_baseline_weights(name, data, names_, train_start, train_end)
            policy = ConstantMix(name, weights, rebalance_every=rebalance_every)
        elif name in FITTED_BASELINES:
            policy = make_baseline(name, rebalance_every=rebalance_every)  # trailing 252 days
        elif name == ANCHOR:
            policy = make_baseline(name, spec=anchor)
        else:
            policy = make_baseline(name)
        result = run_backtest(
            policy, data, start, end, assets=names_, cost_bps=cost_bps, beta=0.0, window=window
        )
        result.name = name
        result.settings["fit"] = fit if name in FITTED_BASELINES else None
        out[name] = result
    return out
