"""Action -> weights, shared by training, export, backtests and the server. Vectors have
``max_assets + 1`` slots, cash first and always live. An action maps affinely to a preference
``(a + 1) / 2`` (a softmax could not put everything in one asset), zeroed on masked slots and
renormalized; NaN is zero preference, and no positive live preference means all cash.

EMA smoothing ``s_t = renorm(mask_t * (beta * s_{t-1} + (1 - beta) * w_t))``, ``s_0 = w_0``, is
what is executed, in training too, so a policy learns under the smoothing it is served with.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

CASH = 0
"""Index of the cash slot in every action, weight and mask vector."""
WEIGHT_SUM_TOLERANCE = 1e-6
"""How far weights a client sends (its current holdings) may sum from 1: clients often hold
float32 weights, whose sum misses 1 by a few 1e-8; a larger gap is a wrong vector, not rounding."""

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]


def live_mask(mask: ArrayLike) -> NDArray[np.bool_]:
    """Boolean mask with the cash slot forced live (a live 1-D bool mask is returned as is:
    never write into the result)."""
    if (
        isinstance(mask, np.ndarray)
        and mask.dtype == np.bool_
        and mask.ndim == 1
        and mask.size
        and mask[CASH]
    ):
        return mask
    m = np.array(mask, dtype=bool)
    if m.ndim == 0 or m.shape[-1] < 1:
        raise ValueError("mask must have at least one slot (cash)")
    m[..., CASH] = True
    return m


def renormalize(x: ArrayLike, mask: ArrayLike) -> FloatArray:
    """Zero masked, negative and non-finite entries and scale to sum to 1 (all-zero: all cash);
    totals are summed sorted, so permuting the slots permutes the result bit for bit."""
    live = live_mask(mask)
    v = np.array(x, dtype=np.float64)  # a copy: written into below
    check_mask_shape(v, live)
    return renormalize_owned(v, live)


def check_mask_shape(v: FloatArray, live: NDArray[np.bool_]) -> None:
    if v.shape[-1:] != live.shape[-1:] or live.ndim > v.ndim:
        raise ValueError(f"weights shape {v.shape} does not match mask shape {live.shape}")


def renormalize_owned(v: FloatArray, live: NDArray[np.bool_]) -> FloatArray:
    """``renormalize`` in place, of a checked float64 array the caller owns."""
    np.fmax(v, 0.0, out=v)  # negatives and NaN -> 0 (fmax ignores NaN)
    v *= live
    if v.ndim == 1:
        ordered = v.copy()
        ordered.sort()
        t = float(np.add.reduce(ordered))
        if 0.0 < t < math.inf:
            v /= t
            return v
    else:
        total = np.add.reduce(np.sort(v, axis=-1), axis=-1, keepdims=True)
        if np.all((total > 0.0) & (total < np.inf)):
            v /= total
            return v
    v[~np.isfinite(v)] = 0.0  # +inf preferences count as zero, like NaN
    top = v.max(axis=-1, keepdims=True)  # scale first so huge finite entries cannot overflow
    v = np.divide(v, top, out=np.zeros_like(v), where=top > 0.0)
    total = np.add.reduce(np.sort(v, axis=-1), axis=-1, keepdims=True)
    empty = total <= 0.0
    v = np.divide(v, total, out=np.zeros_like(v), where=~empty)
    v[..., CASH] = np.where(empty[..., 0], 1.0, v[..., CASH])
    return v


def action_to_weights(action: ArrayLike, mask: ArrayLike) -> FloatArray:
    """Portfolio weights (non-negative, 0 on masked slots, summing to 1) of an action."""
    a = np.asarray(action, dtype=np.float64)
    # Upper bound with np.minimum so NaN stays NaN; renormalize zeroes it and negatives.
    preference = np.minimum((a + 1.0) * 0.5, 1.0)
    return renormalize(preference, mask)


def is_distribution(weights: ArrayLike, mask: ArrayLike | None = None, atol: float = 1e-9) -> bool:
    """True when weights are finite, non-negative, sum to 1 and (if given) respect the mask."""
    w = np.asarray(weights, dtype=np.float64)
    if not np.all(np.isfinite(w)) or np.any(w < -atol):
        return False
    if not np.allclose(w.sum(axis=-1), 1.0, atol=atol, rtol=0.0):
        return False
    if mask is not None:
        return bool(np.all(np.where(live_mask(mask), 0.0, np.abs(w)) <= atol))
    return True


def ema_smooth(
    previous: ArrayLike | None, weights: ArrayLike, mask: ArrayLike, beta: float
) -> FloatArray:
    """One EMA step toward the newly mapped weights (``previous=None`` starts at them); mass on
    slots the mask closes is dropped."""
    b = float(beta)
    if not (0.0 <= b < 1.0):
        raise ValueError(f"smoothing beta must be in [0, 1), got {beta!r}")
    w = np.asarray(weights, dtype=np.float64)
    if previous is None:
        return renormalize(w, mask)
    prev = np.asarray(previous, dtype=np.float64)
    if prev.shape != w.shape:
        raise ValueError(f"previous weights shape {prev.shape} != weights shape {w.shape}")
    live = live_mask(mask)
    blend = b * prev
    blend += (1.0 - b) * w  # the blend is ours: renormalized in place
    check_mask_shape(blend, live)
    return renormalize_owned(blend, live)
