"""Two audits written with every run: is the state well scaled, is the actor saturated?

A tanh actor fed features of very different scales pushes its outputs to +-1 where the gate
``kappa = 1 - a^2`` is ~0 and gradients vanish: the policy freezes while the critic still moves.
These two files make that visible after every run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from allocator.portfolio import NormalizationStats, log_returns, normalize_returns


def _abs_quantiles(x: ArrayLike) -> dict[str, float]:
    a = np.abs(np.asarray(x, dtype=np.float64))
    a = a[np.isfinite(a)]
    if a.size == 0:
        return {"p95_abs": float("nan"), "p99_abs": float("nan"), "max_abs": float("nan")}
    return {
        "p95_abs": float(np.quantile(a, 0.95)),
        "p99_abs": float(np.quantile(a, 0.99)),
        "max_abs": float(a.max()),
    }


def state_scale_summary(
    train_prices: ArrayLike,
    stats: NormalizationStats,
    clip: float,
    weights: ArrayLike,
) -> dict[str, Any]:
    """Per-feature p95/p99 of |x| before and after normalization, and the scale spread.

    ``weights`` are observed weight vectors (e.g. from a rollout); they enter the observation
    unnormalized, so their scale is the reference the return features are compared with.
    """
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
    actions: ArrayLike, near_bound: float = 0.95, equal_tol: float = 1e-6
) -> dict[str, Any]:
    """How often actions sit at the tanh bounds, repeat themselves, and the mean gate kappa.

    ``actions`` is (steps, action_dim) of deterministic actions in [-1, 1] on one path.
    """
    a = np.asarray(actions, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] < 2:
        raise ValueError("need a (steps >= 2, action_dim) array of actions")
    near = np.abs(a) >= near_bound
    equal = np.all(np.abs(np.diff(a, axis=0)) <= equal_tol, axis=1)
    kappa = 1.0 - a**2
    return {
        "steps": int(a.shape[0]),
        "near_bound_threshold": near_bound,
        "near_bound_ratio": float(near.mean()),
        "near_bound_ratio_per_dim": near.mean(axis=0).round(6).tolist(),
        "action_equal_ratio": float(equal.mean()),
        "mean_kappa": float(kappa.mean()),
        "mean_kappa_per_dim": kappa.mean(axis=0).round(6).tolist(),
    }
