"""Hypothesis strategies shared by the per-asset feature, anchor and tilt tests."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from allocator.portfolio import AssetFeatureSpec

SMALL_SPEC = AssetFeatureSpec(window=4, horizons=(2, 3, 6), vol_window=3, clip=5.0)
"""lookback 6 (the longest horizon), so the horizons, the window and the vol window all differ."""

daily_return = st.floats(-0.2, 0.2, allow_nan=False, allow_infinity=False)
garbage = st.sampled_from([np.nan, np.inf, -np.inf, -1.0, 0.0, 1e300])


@st.composite
def universe(
    draw: st.DrawFn,
    n_prices: int = SMALL_SPEC.prices_per_asset,
    max_assets: int = 6,
    extra: int = 2,
) -> tuple[np.ndarray, np.ndarray]:
    """Closes ``(N, P)`` and a mask ``(N + 1,)``; masked rows hold garbage (NaN, <= 0, inf).

    Some rows are copies of others, so ties in every cross-sectional feature occur often.
    """
    n = draw(st.integers(1, max_assets), label="assets")
    p = n_prices + draw(st.integers(0, extra), label="extra closes")
    returns = draw(hnp.arrays(np.float64, (n, p - 1), elements=daily_return))
    start = draw(hnp.arrays(np.float64, (n, 1), elements=st.floats(0.5, 500.0)))
    prices = start * np.exp(np.concatenate([np.zeros((n, 1)), np.cumsum(returns, axis=1)], 1))
    for i in range(n):
        if n > 1 and draw(st.booleans(), label=f"copy into {i}"):
            prices[i] = prices[draw(st.integers(0, n - 1), label="source")]
    mask = np.concatenate([[True], draw(hnp.arrays(np.bool_, n), label="mask")])
    for i in np.flatnonzero(~mask[1:]):
        prices[i] = draw(garbage, label="masked close")
    return prices, mask


@st.composite
def permutation(draw: st.DrawFn, n: int) -> np.ndarray:
    return np.asarray(draw(st.permutations(range(n))), dtype=np.int64)


@st.composite
def distribution(draw: st.DrawFn, n: int, mask: np.ndarray | None = None) -> np.ndarray:
    """A probability vector of length ``n``, zero where ``mask`` is False (cash always live)."""
    raw = draw(
        hnp.arrays(
            np.float64, n, elements=st.floats(0.0, 1.0, allow_nan=False, allow_infinity=False)
        )
    )
    if mask is not None:
        live = np.asarray(mask, dtype=bool).copy()
        live[0] = True
        raw = raw * live
    total = raw.sum()
    if total == 0.0:
        out = np.zeros(n)
        out[0] = 1.0
        return out
    return raw / total
