"""The anchor-tilt mapping ``w_i = anchor_i * exp(k * a_i) / sum_j anchor_j * exp(k * a_j)``
(live slots) and its anchors.

A zero action is the anchor, and ``k`` bounds a step's move from it (a factor ``exp(2k)``
between two weights). The denominator is computed as ``1 + sum_j anchor_j * expm1(k * a_j)``:
with ``a == 0`` every term is exactly 0, so the result is the anchor bit for bit.

The anchor is what a tilt policy holds at a zero action, so an untrained policy holds a
diversified portfolio. The risk-based kinds see the assets in a canonical order (sorted return
rows; identical rows share their mean weight): permuting the assets permutes the anchor exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from allocator.portfolio.hrp import hrp_weights
from allocator.portfolio.min_variance import min_variance_weights
from allocator.portfolio.observation import live_price_window, log_returns
from allocator.portfolio.weights import CASH, BoolArray, FloatArray, live_mask

VOL_FLOOR = 1e-8
"""A return series with zero volatility gets this sigma (its variance ``VOL_FLOOR**2``), so the
inverse-volatility score stays finite and a covariance stays invertible."""

MAX_TILT_STRENGTH = 100.0
"""Largest ``k``: exp(2k) stays far from overflow, and beyond it the tilt is an argmax anyway."""
_CANCELLATION_LIMIT = 0.5
"""Below this the ``1 + sum`` denominator has lost digits to cancellation (most anchor mass on
strongly negative actions), and the max-shifted softmax form is used instead."""


def ledoit_wolf(returns: ArrayLike) -> tuple[FloatArray, float]:
    """``sklearn.covariance.ledoit_wolf(returns.T)`` of returns ``(N, T)`` without sklearn: 20
    returns of 20 assets give a singular sample covariance, and shrinking towards ``mu * I``
    keeps it well conditioned. The shrinkage is 0 where scikit-learn divides 0 by 0."""
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


class AnchorKind(StrEnum):
    """How the live assets share the invested part."""

    EQUAL = "equal"
    INVERSE_VOLATILITY = "inverse_volatility"
    MIN_VARIANCE = "min_variance"
    HRP = "hrp"


@dataclass(frozen=True)
class AnchorSpec:
    """Which anchor, its cash share, and the daily returns of its risk estimate."""

    kind: AnchorKind = AnchorKind.EQUAL
    cash_share: float = 0.05
    vol_window: int = 20

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", AnchorKind(self.kind))
        if not 0.0 <= self.cash_share < 1.0:
            raise ValueError(f"cash_share must be in [0, 1), got {self.cash_share}")
        if self.vol_window < 1:
            raise ValueError(f"vol_window must be >= 1, got {self.vol_window}")

    @property
    def prices_per_asset(self) -> int:
        return 1 if self.kind is AnchorKind.EQUAL else self.vol_window + 1

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "kind": str(self.kind)}


def sorted_sum(x: FloatArray) -> FloatArray:
    """Sum over the last axis in sorted order (keepdims): independent of the slots' order."""
    ordered = np.array(x, dtype=np.float64)  # a copy, sorted in place (no wrapper overhead)
    ordered.sort(axis=-1)
    return np.add.reduce(ordered, axis=-1, keepdims=True)


RISK_ALLOCATIONS: dict[AnchorKind, Callable[[FloatArray], FloatArray]] = {
    AnchorKind.MIN_VARIANCE: min_variance_weights,
    AnchorKind.HRP: hrp_weights,
}


def risk_allocation(
    returns: FloatArray, live: BoolArray, allocate: Callable[[FloatArray], FloatArray]
) -> FloatArray:
    """``allocate`` on the ``risk_covariance`` of each decision's canonically ordered live rows
    of returns ``(..., N, T)``: weights ``(..., N)``, 0 on masked assets."""
    n, t = returns.shape[-2:]
    size = int(np.prod(returns.shape[:-2]))
    r = returns.reshape(size, n, t)
    alive = np.broadcast_to(live, returns.shape[:-1]).reshape(size, n)
    out = np.zeros((size, n))
    for b in range(r.shape[0]):
        rows = np.flatnonzero(alive[b])
        if rows.size == 0:
            continue
        order = np.lexsort(r[b, rows].T[::-1])  # the last key sorts first: column 0
        canonical = np.ascontiguousarray(r[b, rows[order]])
        w = allocate(risk_covariance(canonical))
        new_group = np.concatenate([[True], (canonical[1:] != canonical[:-1]).any(axis=1)])
        group = np.cumsum(new_group) - 1
        if group[-1] + 1 < rows.size:  # equal rows: equal weights, whatever their order
            w = (np.bincount(group, w) / np.bincount(group))[group]
        out[b, rows[order]] = w
    return out.reshape(returns.shape[:-1])


def anchor_weights(prices: ArrayLike, mask: ArrayLike, spec: AnchorSpec) -> FloatArray:
    """Anchor weights ``(..., N + 1)``, cash first, from closes ``(..., N, P)``; all cash with no
    live asset. INVERSE_VOLATILITY: ``1 / max(std(last vol_window log returns), VOL_FLOOR)``."""
    p, live = live_price_window(prices, mask, spec.prices_per_asset)
    if spec.kind is AnchorKind.EQUAL:
        score = live.astype(np.float64)
    elif spec.kind is AnchorKind.INVERSE_VOLATILITY:
        sigma = np.maximum(log_returns(p).std(axis=-1), VOL_FLOOR)
        score = np.where(live, 1.0 / sigma, 0.0)
    else:  # a new kind must be given its rule here or in RISK_ALLOCATIONS
        score = risk_allocation(log_returns(p), live, RISK_ALLOCATIONS[spec.kind])
    total = sorted_sum(score)
    assets = np.divide(
        score * (1.0 - spec.cash_share), total, out=np.zeros_like(score), where=total > 0
    )
    w = np.concatenate([np.where(total > 0, spec.cash_share, 1.0), assets], axis=-1)
    return w / sorted_sum(w)


def masked_anchor(anchor: ArrayLike, mask: ArrayLike) -> FloatArray:
    """The anchor zeroed on masked slots, renormalized only when that removed mass (or the live
    sum is 1e-9 from 1): a live distribution comes back bit for bit, as a zero tilt needs."""
    live = live_mask(mask)
    a = np.asarray(anchor, dtype=np.float64)
    clean = np.where(live & (a > 0.0) & (a < np.inf), a, 0.0)  # NaN compares False
    total = sorted_sum(clean)
    removed = (clean != a).any(axis=-1, keepdims=True) | (abs(total - 1.0) > 1e-9)
    if not removed.any():
        return clean
    scaled = np.divide(clean, total, out=np.zeros_like(clean), where=total > 0)
    scaled[..., CASH] = np.where(total[..., 0] > 0, scaled[..., CASH], 1.0)
    return np.where(removed, scaled, clean)


def check_tilt_strength(k: float) -> float:
    k = float(k)
    if not (math.isfinite(k) and 0.0 <= k <= MAX_TILT_STRENGTH):
        raise ValueError(f"tilt strength k must be in [0, {MAX_TILT_STRENGTH}], got {k}")
    return k


def tilt_weights(action: ArrayLike, anchor: ArrayLike, mask: ArrayLike, k: float) -> FloatArray:
    """Weights ``(..., N + 1)`` of an action (clipped to [-1, 1], NaN as 0), an anchor and a
    mask; sums run sorted, so permuting live slots permutes the result."""
    k = check_tilt_strength(k)
    return apply_tilt(action, masked_anchor(anchor, mask), k)


def apply_tilt(action: ArrayLike, base: FloatArray, k: float) -> FloatArray:
    """``tilt_weights`` of an anchor already through ``masked_anchor`` and a checked ``k``."""
    a = np.asarray(action, dtype=np.float64)
    if a.shape[-1] != base.shape[-1]:
        raise ValueError(f"action has {a.shape[-1]} slots, the anchor {base.shape[-1]}")
    if a.ndim == 1 and base.ndim == 1:
        one = _tilt_one(a, base, k)
        if one is not None:
            return one
    ka = np.minimum(np.maximum(a, -1.0), 1.0)  # NaN stays NaN here ...
    ka *= k
    ka = np.where(ka == ka, ka, 0.0)  # ... and counts as 0
    # Masked slots need no action of their own: ``base`` is 0 there and ``ka`` finite, so they
    # add nothing to the sum and get weight 0.
    terms = np.expm1(ka)
    terms *= base
    terms.sort(axis=-1)  # sorted sum: independent of the slots' order
    denom = np.add.reduce(terms, axis=-1, keepdims=True)
    denom += 1.0
    w = np.exp(ka)
    w *= base
    unstable = denom < _CANCELLATION_LIMIT
    if not unstable.any():
        w /= denom
        return w
    shift = np.max(np.where(base > 0, ka, -np.inf), axis=-1, keepdims=True)
    z = base * np.exp(ka - shift)
    return np.where(unstable, z / sorted_sum(z), w / np.where(unstable, 1.0, denom))


def _tilt_one(a: FloatArray, base: FloatArray, k: float) -> FloatArray | None:
    """``apply_tilt`` of one action in fewer numpy calls, or None for the general path."""
    ka = np.maximum(a, -1.0)
    np.minimum(ka, 1.0, out=ka)
    ka *= k
    if math.isnan(np.add.reduce(ka)):  # clipped, so only a NaN makes the sum NaN
        return None
    terms = np.expm1(ka)
    terms *= base
    terms.sort()
    denom = float(np.add.reduce(terms)) + 1.0
    if not denom >= _CANCELLATION_LIMIT:
        return None
    w = np.exp(ka)
    w *= base
    w /= denom
    return w
