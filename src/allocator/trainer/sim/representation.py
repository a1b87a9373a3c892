"""Feature set and action mapping settings, and their ``portfolio`` contract functions
vectorized over every decision date at reset, so stepping stays a slice and a small mapping."""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray
from pydantic import Field

from allocator.portfolio import (
    MAX_TILT_STRENGTH,
    AnchorKind,
    AnchorSpec,
    AssetFeatureSpec,
    FeatureNormalization,
    anchor_weights,
    cross_sectional_features,
    masked_anchor,
    own_features,
    standardize,
)
from allocator.typed_config import StrictModel

FeatureSet = Literal["returns", "asset_v1"]


class AnchorSettings(StrictModel):
    """The portfolio a zero tilt action holds, computed from the decision's own price window."""

    kind: Literal["equal", "inverse_volatility", "min_variance", "hrp"] = Field(
        "equal",
        description="how live assets share the invested part: equally, by inverse volatility, "
        "as the long-only minimum-variance or the hierarchical risk parity portfolio",
    )
    cash_share: float = Field(0.05, ge=0, lt=1, description="anchor weight of cash")
    vol_window: int = Field(
        20,
        ge=2,
        description="daily returns of the risk estimate: the inverse-vol sigma, or the "
        "Ledoit-Wolf covariance of min_variance and hrp (unused by equal)",
    )

    @property
    def spec(self) -> AnchorSpec:
        return AnchorSpec(AnchorKind(self.kind), self.cash_share, self.vol_window)


class ActionSettings(StrictModel):
    """How an action in [-1, 1] per slot becomes target weights."""

    mapping: Literal["affine", "tilt"] = Field(
        "affine", description="'affine': (a+1)/2 renormalized; 'tilt': anchor * exp(k a)"
    )
    k: float = Field(1.0, gt=0, le=MAX_TILT_STRENGTH, description="tilt strength (tilt only)")
    anchor: AnchorSettings = AnchorSettings()

    @property
    def tilt_anchor(self) -> AnchorSpec | None:
        """The tilt mapping's zero-action portfolio (None for affine): the ``anchor`` baseline's."""
        return self.anchor.spec if self.mapping == "tilt" else None


class FeatureTable:
    """The per-asset feature columns of a whole dataset: the own columns normalized once, the
    cross-sectional ones per episode. Memory: ``T x N x F`` float32 plus the sums."""

    def __init__(
        self, prices: NDArray[np.float64], spec: AssetFeatureSpec, norm: FeatureNormalization
    ) -> None:
        if norm.n_features != spec.n_features:
            raise ValueError(
                f"normalization has {norm.n_features} features, the spec {spec.n_features}"
            )
        self.spec, self.norm = spec, norm
        n_own = spec.n_own_features
        prices = np.asarray(prices, dtype=np.float64)
        windows = sliding_window_view(prices, spec.prices_per_asset, axis=0)  # (T, N, P) view
        n_dates, n_assets = windows.shape[0], windows.shape[1]
        self.own = np.empty((n_dates, n_assets, n_own), np.float32)
        self.sums = np.empty((n_dates, n_assets, len(spec.horizons)))
        mean, std = norm.mean[:n_own], norm.std[:n_own]
        # Windows that reach before an asset's first close hold NaN: their rows are never used.
        with np.errstate(invalid="ignore", divide="ignore"):
            for start in range(0, n_dates, 512):  # bounded temporaries
                rows = slice(start, start + 512)
                own, self.sums[rows] = own_features(windows[rows], spec)
                self.own[rows] = standardize(own, mean, std, spec.clip)

    def episode(
        self, assets: list[int], first: int, n_dates: int, max_assets: int
    ) -> NDArray[np.float32]:
        """Normalized features ``(n_dates, max_assets * F)`` from the decision at row ``first``."""
        spec, n_own = self.spec, self.spec.n_own_features
        rows = slice(first - spec.lookback, first - spec.lookback + n_dates)
        if rows.start < 0 or rows.stop > self.own.shape[0]:
            raise ValueError(f"rows {first}..{first + n_dates - 1} lack the features' history")
        k = len(assets)
        cross = cross_sectional_features(self.sums[rows][:, assets], np.ones((1, k), dtype=bool))
        out = np.zeros((n_dates, max_assets, spec.n_features), np.float32)
        out[:, :k, :n_own] = self.own[rows][:, assets]
        out[:, :k, n_own:] = standardize(
            cross, self.norm.mean[n_own:], self.norm.std[n_own:], spec.clip
        )
        return out.reshape(n_dates, -1)


def episode_anchors(
    prices: NDArray[np.float64], spec: AnchorSpec, n_slots: int, n_prices: int
) -> NDArray[np.float64]:
    """Masked anchor weights ``(D, n_slots)`` for every decision, from trailing windows."""
    windows = sliding_window_view(prices, n_prices, axis=0)
    k = windows.shape[1]
    out = np.zeros((windows.shape[0], n_slots))
    out[:, : k + 1] = anchor_weights(windows, np.ones((1, k + 1), dtype=bool), spec)
    return masked_anchor(out, np.arange(n_slots) <= k)
