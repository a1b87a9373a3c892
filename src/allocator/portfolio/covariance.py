"""The risk estimate of the risk-based anchors: a Ledoit-Wolf shrunk covariance of log returns.

A sample covariance of ``T`` returns has rank at most ``T - 1``: with 20 daily returns for 20
assets it is singular, and a minimum-variance portfolio of it would put everything on a
combination that merely happened to be flat in the window. Ledoit and Wolf (2004) shrink it
towards ``mu * I`` (``mu`` the mean variance) by the intensity that minimizes the expected
Frobenius loss, estimated from the same returns, which makes the estimate well conditioned
exactly where the sample is not.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]

VOL_FLOOR = 1e-8
"""A return series with zero volatility gets this sigma (its variance ``VOL_FLOOR**2``), so the
inverse-volatility score stays finite and a covariance stays invertible."""


def ledoit_wolf(returns: ArrayLike) -> tuple[FloatArray, float]:
    """The shrunk covariance ``(N, N)`` and the shrinkage of returns ``(N, T)``, one row per asset.

    The estimate of ``sklearn.covariance.ledoit_wolf(returns.T)``: returns centered per asset,
    the empirical covariance with ``ddof=0``, one asset left unshrunk. The shrinkage is clipped
    to ``[0, 1]`` and is 0 when the target is the sample itself (no return moved), where
    scikit-learn can divide 0 by 0.
    """
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
    """``ledoit_wolf(returns)`` plus ``VOL_FLOOR**2`` on the diagonal: the anchors' risk model.

    The floor keeps the matrix invertible when shrinkage cannot (constant closes, a window of
    one return, returns that are multiples of one pattern) and moves any real estimate by a
    relative 1e-12 or less (daily variances are ~1e-4).
    """
    cov, _ = ledoit_wolf(returns)
    cov[np.diag_indices(cov.shape[0])] += VOL_FLOOR * VOL_FLOOR
    return cov
