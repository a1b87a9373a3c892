"""Two audits written with every run: is the state well scaled, is the actor saturated (a tanh
actor at +-1 has no gradient, ``kappa = 1 - a^2`` ~0, and freezes)?"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from allocator.artifacts.files import write_json
from allocator.portfolio import NormalizationStats, log_returns, normalize_returns
from allocator.trainer.sim.backtest import BacktestResult
from allocator.trainer.training.config import TrainConfig
from allocator.trainer.training.inputs import TrainingData

SATURATION_FILE = "action_saturation.json"
SCALE_FILE = "state_scale_summary.json"


def _abs_quantiles(x: ArrayLike) -> dict[str, float]:
    a = np.abs(np.asarray(x, dtype=np.float64))
    a = a[np.isfinite(a)]
    p95, p99, top = np.quantile(a, [0.95, 0.99, 1.0]) if a.size else (np.nan,) * 3
    return {"p95_abs": float(p95), "p99_abs": float(p99), "max_abs": float(top)}


def state_scale_summary(
    train_prices: ArrayLike, stats: NormalizationStats, clip: float, weights: ArrayLike
) -> dict[str, Any]:
    """Per-feature p95/p99 of |x| before and after normalization, and the scale spread against
    the observed ``weights``, which enter the observation unnormalized."""
    raw = log_returns(train_prices, axis=0)
    raw = raw[np.isfinite(raw)]
    after = normalize_returns(raw, stats, clip)
    w = np.asarray(weights, dtype=np.float64)
    features = {
        "log_return": {"pre_stats": _abs_quantiles(raw), "post_stats": _abs_quantiles(after)},
        "weights": {"pre_stats": _abs_quantiles(w), "post_stats": _abs_quantiles(w)},
        "mask": {"pre_stats": _abs_quantiles([0.0, 1.0]), "post_stats": _abs_quantiles([0.0, 1.0])},
    }

    def spread(key: str) -> float:
        p99 = [f[key]["p99_abs"] for f in features.values() if f[key]["p99_abs"] > 0]
        return float(max(p99) / min(p99)) if p99 else float("nan")

    return {
        "features": features,
        "normalization": stats.to_dict() | {"clip": clip},
        "p99_scale_ratio_pre": spread("pre_stats"),
        "p99_scale_ratio_post": spread("post_stats"),
    }


def action_saturation(
    actions: ArrayLike,
    near_bound: float = 0.95,
    equal_tol: float = 1e-6,
    *,
    mask: ArrayLike | None = None,
    mapping: str | None = None,
    k: float = 1.0,
) -> dict[str, Any]:
    """How often actions (steps, action_dim) sit at the tanh bounds, repeat themselves, and the
    mean gate kappa; with a ``mask`` over live slots only, and ``mapping`` adds what the bound
    means there (under ``tilt``: the anchor weight times ``exp(+-k)``)."""
    a = np.asarray(actions, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] < 2:
        raise ValueError("need a (steps >= 2, action_dim) array of actions")
    live = np.ones_like(a, dtype=bool)
    if mask is not None:
        live = np.broadcast_to(np.asarray(mask, dtype=bool), a.shape).copy()
        live[:, 0] = True  # cash is always live
    near = np.abs(a) >= near_bound
    moved = np.abs(np.diff(a, axis=0)) > equal_tol
    equal = ~np.any(moved & live[1:], axis=1)
    kappa = 1.0 - a**2
    out: dict[str, Any] = {
        "steps": int(a.shape[0]),
        "near_bound_threshold": near_bound,
        "near_bound_ratio": float(near[live].mean()),
        "near_bound_ratio_per_dim": _per_dim(near, live),
        "action_equal_ratio": float(equal.mean()),
        "mean_kappa": float(kappa[live].mean()),
        "mean_kappa_per_dim": _per_dim(kappa, live),
    }
    if mask is not None:
        out["live_slots_per_step"] = float(live.sum(axis=1).mean())
    if mapping is not None:
        out["mapping"] = _mapping_summary(a, live, mapping, k)
    return out


def _per_dim(x: np.ndarray, live: np.ndarray) -> list[float | None]:
    """Mean over the steps where each slot is live (None for a slot never live)."""
    n = live.sum(axis=0)
    total = np.where(live, x, 0.0).sum(axis=0)
    return [round(float(t / c), 6) if c else None for t, c in zip(total, n, strict=True)]


def _mapping_summary(a: np.ndarray, live: np.ndarray, mapping: str, k: float) -> dict[str, Any]:
    if mapping != "tilt":
        return {"name": mapping}
    log_tilt = k * np.abs(np.clip(np.nan_to_num(a), -1.0, 1.0))
    idle = np.all(~live | (log_tilt <= 0.05 * k), axis=1)
    return {
        "name": mapping,
        "k": k,
        "max_log_tilt": k,
        "mean_abs_log_tilt": float(log_tilt[live].mean()),
        "anchor_held_ratio": float(idle.mean()),
    }


def write_audits(
    run_dir: Path,
    config: TrainConfig,
    data: TrainingData,
    agent: BacktestResult,
    actions: np.ndarray,
) -> None:
    """The state-scale and action-saturation audits of the validation path."""
    scale = state_scale_summary(
        data.fit.prices, data.stats, config.env.obs_clip, agent.executed_weights.to_numpy()
    )
    write_json(run_dir / SCALE_FILE, scale)
    write_json(run_dir / SATURATION_FILE, backtest_saturation(config, agent, actions))


def backtest_saturation(
    config: TrainConfig, agent: BacktestResult, actions: np.ndarray
) -> dict[str, Any]:
    """``action_saturation`` of a backtest's actions over its live slots (cash, then assets)."""
    live = np.arange(actions.shape[1]) <= len(agent.settings["assets"])
    action = config.env.action
    return action_saturation(actions, mask=live, mapping=action.mapping, k=action.k)
