"""Tilt mapping: an action multiplies an anchor portfolio's weights by ``exp(k * a_i)``.

    w_i = anchor_i * exp(k * a_i) / sum_j anchor_j * exp(k * a_j)      (live slots)

A zero action is the anchor, so an untrained actor (outputs near 0) holds a diversified
portfolio, and ``k`` bounds how far one step can move from it: a weight changes by at most a
factor ``exp(2k)`` relative to another. The denominator is computed as ``1 + sum_j anchor_j *
(exp(k * a_j) - 1)``: with an anchor summing to 1 it equals the sum above, and with ``a == 0``
every term is exactly 0, so the result is the anchor bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from allocator.portfolio.anchors import masked_anchor, sorted_sum
from allocator.portfolio.weights import live_mask

FloatArray = NDArray[np.float64]

MAX_TILT_STRENGTH = 100.0
"""Largest ``k``: exp(2k) stays far from overflow, and beyond it the tilt is an argmax anyway."""
_CANCELLATION_LIMIT = 0.5
"""Below this the ``1 + sum`` denominator has lost digits to cancellation (most anchor mass on
strongly negative actions), and the max-shifted softmax form is used instead."""


def check_tilt_strength(k: float) -> float:
    """``k`` as a float when it is a usable tilt strength, else ``ValueError``."""
    k = float(k)
    if not (math.isfinite(k) and 0.0 <= k <= MAX_TILT_STRENGTH):
        raise ValueError(f"tilt strength k must be in [0, {MAX_TILT_STRENGTH}], got {k}")
    return k


def tilt_weights(action: ArrayLike, anchor: ArrayLike, mask: ArrayLike, k: float) -> FloatArray:
    """Weights ``(..., N + 1)`` from an action, an anchor (both cash first) and a mask.

    The action is clipped to [-1, 1] with NaN counting as 0. Masked slots get 0: the anchor is
    zeroed there first and renormalized if that removed mass (``masked_anchor``). The result is
    a distribution over the live slots; sums run in sorted order, so permuting the live slots
    permutes the weights exactly.
    """
    k = check_tilt_strength(k)
    live = live_mask(mask)
    base = masked_anchor(anchor, live)
    a = np.asarray(action, dtype=np.float64)
    a = np.where(np.isnan(a), 0.0, np.clip(a, -1.0, 1.0))
    if a.shape[-1] != base.shape[-1]:
        raise ValueError(f"action has {a.shape[-1]} slots, the anchor {base.shape[-1]}")
    ka = np.where(live, k * a, 0.0)
    denom = 1.0 + sorted_sum(base * np.expm1(ka))
    unstable = denom < _CANCELLATION_LIMIT
    w = base * np.exp(ka) / np.where(unstable, 1.0, denom)
    if unstable.any():
        shift = np.max(np.where(base > 0, ka, -np.inf), axis=-1, keepdims=True)
        z = base * np.exp(ka - shift)
        w = np.where(unstable, z / sorted_sum(z), w)
    return w
