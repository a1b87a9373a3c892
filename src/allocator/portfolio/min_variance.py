"""Long-only minimum variance: ``min w' S w`` subject to ``sum w = 1``, ``w >= 0``, solved exactly.

With ``S = L L'`` it is the non-negative least squares ``min ||L' v - L^{-1} 1||`` over
``v >= 0``, and ``w = v / sum v``. Lawson-Hanson solves that from ``A' A = S`` and ``A' b = 1``
alone, so no Cholesky factor (which a barely positive definite estimate can fail) is taken.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from allocator.portfolio.weights import BoolArray, FloatArray

_EPS = float(np.finfo(np.float64).eps)


def nnls_normal(gram: ArrayLike, rhs: ArrayLike) -> FloatArray:
    """Lawson-Hanson: ``argmin ||A v - b||`` over ``v >= 0`` from ``A' A`` (positive definite)
    and ``A' b``; ties go to the lowest index."""
    g = np.asarray(gram, dtype=np.float64)
    c = np.asarray(rhs, dtype=np.float64)
    n = c.shape[0]
    if g.shape != (n, n):
        raise ValueError(f"gram must be ({n}, {n}), got {g.shape}")
    v = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    scale = float(np.abs(g).max(initial=0.0))
    for _ in range(3 * n + 1):  # scipy's cap of 3n outer iterations (v stays feasible), plus one
        gradient = c - g @ v
        tol = 16.0 * n * _EPS * (float(np.abs(c).max()) + scale * float(np.abs(v).sum()))
        entering = ~passive & (gradient > tol)
        if not entering.any():
            break
        passive[int(np.argmax(np.where(entering, gradient, -np.inf)))] = True
        v = _feasible_step(g, c, v, passive)
    return v


def _feasible_step(g: FloatArray, c: FloatArray, v: FloatArray, passive: BoolArray) -> FloatArray:
    """Lawson-Hanson's inner loop; updates ``passive`` in place."""
    while passive.any():
        idx = np.flatnonzero(passive)
        z = np.zeros_like(v)
        z[idx] = np.linalg.solve(g[np.ix_(idx, idx)], c[idx])
        if np.all(z[idx] > 0.0):
            return z
        blocked = idx[z[idx] <= 0.0]
        gap = v[blocked] - z[blocked]  # >= 0: v >= 0 >= z on the blocked variables
        ratios = np.divide(v[blocked], gap, out=np.zeros_like(gap), where=gap > 0.0)
        first = int(blocked[np.argmin(ratios)])
        v = v + ratios.min() * (z - v)
        v[first] = 0.0
        passive &= v > 0.0
        v[~passive] = 0.0
    return v


def min_variance_weights(cov: ArrayLike) -> FloatArray:
    """The long-only minimum-variance weights ``(N,)`` of a positive definite covariance."""
    s = np.asarray(cov, dtype=np.float64)
    n = s.shape[0]
    v = nnls_normal(s, np.ones(n))
    total = v.sum()
    if not (np.isfinite(total) and total > 0.0):  # pragma: no cover - needs a non-PD input
        return np.full(n, 1.0 / n)
    return v / total
