"""EMA smoothing ``s_t = renorm(mask_t * (beta * s_{t-1} + (1 - beta) * w_t))``, ``s_0 = w_0``:
what is executed, in training too, so a policy learns under the smoothing it is served with."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from allocator.portfolio.weights import (
    FloatArray,
    check_mask_shape,
    live_mask,
    renormalize,
    renormalize_owned,
)


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
