"""The risk-based anchors' Ledoit-Wolf covariance: 20 returns of 20 assets give a singular sample
covariance, and shrinking towards ``mu * I`` keeps it well conditioned."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]

VOL_FLOOR = 1e-8
"""A return series with zero volatility gets this sigma (its variance ``VOL_FLOOR**2``), so the
inverse-volatility score stays finite and a covariance stays invertible."""


def ledoit_wolf(returns: ArrayLike) -> tuple[FloatArray, float]:
    """``sklearn.covariance.ledoit_wolf(returns.T)`` of returns ``(N, T)`` without sklearn; the
    shrinkage is 0 where scikit-learn divides 0 by 0 (no return moved)."""
    r = np.asarray(returns, dtype=np.float64)
    if r.ndim != 2 or r.shape[1] < 1:
        raise ValueError(f"returns must be (N, T) with T >= 1, got shape {r.shape}")
    n, t = r.shape
    x = r - r.mean(axis=1, keepdims=True)
    gram = x @ x.T
    emp = gram / t
    if n == 1:
        return emp, 0.0
    x2 = x * x
    variances = x2.sum(axis=1) / t
    mu = variances.sum() / n
    beta_sum = float((x2 @ x2.T).sum())
    delta_sum = float((gram * gram).sum()) / t**2
    beta = (beta_sum / t - delta_sum) / (n * t)
    delta = (delta_sum - 2.0 * mu * variances.sum() + n * mu * mu) / n
    shrinkage = float(np.clip(min(beta, delta) / delta, 0.0, 1.0)) if delta > 0 else 0.0
    shrunk = (1.0 - shrinkage) * emp
    shrunk[np.diag_indices(n)] += shrinkage * mu
    return shrunk, shrinkage


def risk_covariance(returns: ArrayLike) -> FloatArray:
    """``ledoit_wolf(returns)`` plus ``VOL_FLOOR**2`` on the diagonal, so it is invertible."""
    cov, _ = ledoit_wolf(returns)
    cov[np.diag_indices(cov.shape[0])] += VOL_FLOOR * VOL_FLOOR
    return cov
