"""Tilt mapping ``w_i = anchor_i * exp(k * a_i) / sum_j anchor_j * exp(k * a_j)`` (live slots).

A zero action is the anchor, and ``k`` bounds a step's move from it (a factor ``exp(2k)``
between two weights). The denominator is computed as ``1 + sum_j anchor_j * expm1(k * a_j)``:
with ``a == 0`` every term is exactly 0, so the result is the anchor bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from allocator.portfolio.anchors import masked_anchor, sorted_sum
from allocator.portfolio.weights import FloatArray, live_mask

MAX_TILT_STRENGTH = 100.0
"""Largest ``k``: exp(2k) stays far from overflow, and beyond it the tilt is an argmax anyway."""
_CANCELLATION_LIMIT = 0.5
"""Below this the ``1 + sum`` denominator has lost digits to cancellation (most anchor mass on
strongly negative actions), and the max-shifted softmax form is used instead."""


def check_tilt_strength(k: float) -> float:
    k = float(k)
    if not (math.isfinite(k) and 0.0 <= k <= MAX_TILT_STRENGTH):
        raise ValueError(f"tilt strength k must be in [0, {MAX_TILT_STRENGTH}], got {k}")
    return k


def tilt_weights(action: ArrayLike, anchor: ArrayLike, mask: ArrayLike, k: float) -> FloatArray:
    """Weights ``(..., N + 1)`` of an action (clipped to [-1, 1], NaN as 0), an anchor and a
    mask; sums run sorted, so permuting live slots permutes the result."""
    k = check_tilt_strength(k)
    live = live_mask(mask)
    return apply_tilt(action, masked_anchor(anchor, live), k)


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
    stable = denom.item() >= _CANCELLATION_LIMIT if denom.size == 1 else None
    if stable or (stable is None and not (denom < _CANCELLATION_LIMIT).any()):
        w /= denom
        return w
    unstable = denom < _CANCELLATION_LIMIT
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
