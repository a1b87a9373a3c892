"""Input checks of the statistics: a NaN or mismatched lengths make a statistic silently wrong."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

FLAT = 1e-12
"""Standard deviation below which a daily series is constant (float rounding, not noise)."""

MIN_DAYS = 20
"""Fewest daily returns a bootstrap or a test accepts: below a month the variances are noise."""


def daily_returns(values: ArrayLike, name: str, min_days: int = MIN_DAYS) -> NDArray[np.float64]:
    """``values`` as a finite 1-D float64 array of at least ``min_days`` entries."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {x.shape}")
    if x.size < min_days:
        raise ValueError(f"{name} has {x.size} daily returns; at least {min_days} are needed")
    bad = np.flatnonzero(~np.isfinite(x))
    if bad.size:
        raise ValueError(f"{name} has {bad.size} non-finite value(s), the first at day {bad[0]}")
    return x


def paired_returns(
    first: ArrayLike, second: ArrayLike, names: tuple[str, str]
) -> NDArray[np.float64]:
    """Two return series on the same days as a ``(days, 2)`` array; lengths must match."""
    a = daily_returns(first, names[0])
    b = daily_returns(second, names[1])
    if a.size != b.size:
        raise ValueError(
            f"{names[0]} has {a.size} daily returns but {names[1]} has {b.size}: "
            "the series must cover the same days"
        )
    return np.column_stack([a, b])


def positive_int(value: int, name: str) -> int:
    """``value`` when it is an integer >= 1 (counts of draws, trials, days per block)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)
