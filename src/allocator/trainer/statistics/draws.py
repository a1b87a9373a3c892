"""Intervals over independent draws of a generated market: an IID bootstrap of whole draws."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from arch.bootstrap import IIDBootstrap

MIN_BCA_DRAWS = 5
"""Below this many draws BCa's jackknife has too little to correct with: percentile instead."""


def mean_interval(
    values: Sequence[float], reps: int = 10_000, seed: int = 0, size: float = 0.95
) -> tuple[float, float] | None:
    """The ``size`` bootstrap interval of the mean over draws; None from fewer than two draws,
    the point itself where every draw agrees."""
    x = np.asarray([v for v in values if np.isfinite(v)], dtype=np.float64)
    if x.size < 2:
        return None
    if np.ptp(x) == 0:
        return float(x[0]), float(x[0])
    method: Literal["bca", "percentile"] = "bca" if x.size >= MIN_BCA_DRAWS else "percentile"
    boot = IIDBootstrap(x, seed=seed)
    with np.errstate(all="ignore"):
        low, high = boot.conf_int(np.mean, reps=reps, method=method, size=size)[:, 0]
    return float(low), float(high)
