"""What the policy sees and what its action means: feature set and action mapping settings.

The environment precomputes an episode's per-asset features and anchors at reset with the
``portfolio`` contract functions (one vectorized call over every decision date), so stepping
stays a slice and a small mapping, whatever the feature set.
"""

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
    action_to_weights,
    anchor_weights,
    asset_features,
    normalize_features,
    tilt_weights,
)
from allocator.typed_config import StrictModel

FeatureSet = Literal["returns", "asset_v1"]
ActionMappingName = Literal["affine", "tilt"]


class AnchorSettings(StrictModel):
    """The portfolio a zero tilt action holds, computed from the decision's own price window."""

    kind: Literal["equal", "inverse_volatility"] = Field(
        "equal", description="how live assets share the invested part"
    )
    cash_share: float = Field(0.05, ge=0, lt=1, description="anchor weight of cash")
    vol_window: int = Field(20, ge=2, description="daily returns of the inverse-vol sigma")

    @property
    def spec(self) -> AnchorSpec:
        return AnchorSpec(
            kind=AnchorKind(self.kind), cash_share=self.cash_share, vol_window=self.vol_window
        )


class ActionSettings(StrictModel):
    """How an action in [-1, 1] per slot becomes target weights."""

    mapping: ActionMappingName = Field(
        "affine", description="'affine': (a+1)/2 renormalized; 'tilt': anchor * exp(k a)"
    )
    k: float = Field(1.0, gt=0, le=MAX_TILT_STRENGTH, description="tilt strength (tilt only)")
    anchor: AnchorSettings = AnchorSettings()


def price_windows(prices: NDArray[np.float64], n_prices: int) -> NDArray[np.float64]:
    """``(T, N)`` closes -> ``(T - n_prices + 1, N, n_prices)`` trailing windows (a view)."""
    return sliding_window_view(prices, n_prices, axis=0)


def episode_features(
    prices: NDArray[np.float64],
    spec: AssetFeatureSpec,
    norm: FeatureNormalization,
    max_assets: int,
) -> NDArray[np.float32]:
    """Normalized features ``(D, max_assets * F)`` for every decision of an episode.

    ``prices`` holds the episode's live assets ``(D + P - 1, k)`` with ``P`` closes of history
    before the first decision; empty slots get zero rows, as ``build_asset_observation`` does.
    """
    windows = price_windows(prices, spec.prices_per_asset)
    n_dates, k = windows.shape[0], windows.shape[1]
    mask = np.ones((1, k + 1), dtype=bool)
    feats = normalize_features(asset_features(windows, mask, spec), norm, spec.clip, mask)
    out = np.zeros((n_dates, max_assets, spec.n_features), np.float32)
    out[:, :k] = feats
    return out.reshape(n_dates, -1)


def episode_anchors(
    prices: NDArray[np.float64], spec: AnchorSpec, n_slots: int, n_prices: int
) -> NDArray[np.float64]:
    """Anchor weights ``(D, n_slots)`` for every decision, from the same trailing windows."""
    windows = price_windows(prices, n_prices)
    k = windows.shape[1]
    live = np.ones((1, k + 1), dtype=bool)
    out = np.zeros((windows.shape[0], n_slots))
    out[:, : k + 1] = anchor_weights(windows, live, spec)
    return out


class ActionMapper:
    """Maps an action to raw target weights at one decision: affine, or a tilt of the anchor."""

    def __init__(self, settings: ActionSettings) -> None:
        self.tilt = settings.mapping == "tilt"
        self.k = settings.k

    def __call__(
        self,
        action: NDArray[np.float32] | NDArray[np.float64],
        mask: NDArray[np.bool_],
        anchor: NDArray[np.float64] | None,
    ) -> NDArray[np.float64]:
        if not self.tilt:
            return action_to_weights(action, mask)
        assert anchor is not None, "the tilt mapping needs the decision's anchor"
        return tilt_weights(action, anchor, mask, self.k)
