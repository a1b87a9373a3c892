"""Per-asset features: the same F numbers for every asset, whatever its slot or the universe size,
so a shared network sees in each row all it needs. Order, ``F = window + 3 * len(horizons) + 2``:

1. ``ret_k`` (k = 0..window-1): the ``window`` most recent daily log returns, oldest first;
2. ``sum_h`` per horizon: the log return over the last h days;
3. ``vol_{vol_window}``: the standard deviation (ddof=0) of the last ``vol_window`` returns;
4. ``drawdown``: log(last price / highest of the last ``lookback + 1`` prices), <= 0;
5. ``rank_h`` per horizon: the average rank of ``sum_h`` among live assets, scaled to [-1, 1]
   (0 when a single asset is live);
6. ``market_h`` per horizon: the mean of ``sum_h`` over live assets.

Cross-sectional sums run sorted: permuting the live assets permutes the rows bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import ArrayLike, NDArray

from allocator.portfolio.observation import (
    FeatureSpec,
    assemble_observation,
    live_price_window,
    log_returns,
)
from allocator.portfolio.weights import BoolArray, FloatArray, live_mask

FEATURE_SET_VERSIONS = (1,)
"""Feature-set versions this code computes; a model trained on another version is refused."""
STD_FLOOR = 1e-8
"""A fitted standard deviation below this means a constant feature: it is given std 1, so the
feature normalizes to a constant instead of amplifying rounding noise by 1e8."""
_FIT_CHUNK_ELEMENTS = 4_000_000
"""Bound on the pairwise rank comparisons (dates x assets x assets x horizons) held at once."""


@dataclass(frozen=True)
class AssetFeatureSpec:
    """Versioned per-asset feature set; version 1 is the module docstring's."""

    window: int = 30
    horizons: tuple[int, ...] = field(default=(5, 10, 20, 30))
    vol_window: int = 20
    clip: float = 10.0
    version: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "horizons", tuple(int(h) for h in self.horizons))
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if not self.horizons:
            raise ValueError("horizons must name at least one horizon")
        if min(self.horizons) < 1 or len(set(self.horizons)) != len(self.horizons):
            raise ValueError(f"horizons must be distinct and >= 1, got {self.horizons}")
        if self.vol_window < 1:
            raise ValueError(f"vol_window must be >= 1, got {self.vol_window}")
        if not self.clip > 0:
            raise ValueError(f"clip must be > 0, got {self.clip}")
        if self.version not in FEATURE_SET_VERSIONS:
            raise ValueError(
                f"feature set version {self.version} is not supported "
                f"(supported: {', '.join(map(str, FEATURE_SET_VERSIONS))})"
            )

    @property
    def lookback(self) -> int:
        return max(self.window, max(self.horizons), self.vol_window)

    @property
    def prices_per_asset(self) -> int:
        return self.lookback + 1

    @property
    def names(self) -> tuple[str, ...]:
        return (
            *(f"ret_{k}" for k in range(self.window)),
            *(f"sum_{h}" for h in self.horizons),
            f"vol_{self.vol_window}",
            "drawdown",
            *(f"rank_{h}" for h in self.horizons),
            *(f"market_{h}" for h in self.horizons),
        )

    @property
    def n_features(self) -> int:
        return self.window + 3 * len(self.horizons) + 2

    @property
    def n_own_features(self) -> int:
        return self.window + len(self.horizons) + 2

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "horizons": list(self.horizons)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AssetFeatureSpec:
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown feature spec field(s): {', '.join(sorted(unknown))}")
        return cls(**data)


@dataclass(frozen=True)
class FeatureNormalization:
    """Per-feature mean and standard deviation, fitted on the training period only."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        mean = tuple(float(x) for x in self.mean)
        std = tuple(float(x) for x in self.std)
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)
        if len(mean) != len(std) or not mean:
            raise ValueError(f"mean ({len(mean)}) and std ({len(std)}) need the same length > 0")
        if not all(np.isfinite(mean)):
            raise ValueError("normalization mean must be finite")
        if not all(np.isfinite(s) and s > 0 for s in std):
            raise ValueError("normalization std must be finite and > 0")

    @property
    def n_features(self) -> int:
        return len(self.mean)

    def to_dict(self) -> dict[str, list[float]]:
        return {"mean": list(self.mean), "std": list(self.std)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FeatureNormalization:
        return cls(mean=tuple(data["mean"]), std=tuple(data["std"]))


def cross_sectional_rank(values: FloatArray, live: BoolArray) -> FloatArray:
    """Average rank of each live asset's value among live assets, scaled to [-1, 1]; ties share
    their average rank, a lone live asset and masked rows (sorted last as +inf) get 0."""
    v = np.where(live[..., None, :], np.swapaxes(values, -1, -2), np.inf)  # (..., H, N)
    v = np.ascontiguousarray(v)  # sorted along its last axis: make that axis the dense one
    order = np.argsort(v, axis=-1, kind="stable")
    s = np.take_along_axis(v, order, axis=-1)
    n_rows = v.shape[-1]
    differs = s[..., 1:] != s[..., :-1]
    if differs.all():  # no ties (the usual case): a value's rank is its sorted position
        mid = np.broadcast_to(np.arange(n_rows, dtype=np.float64), s.shape)
    else:
        pos = np.arange(n_rows)
        first = np.ones(s.shape, dtype=bool)
        first[..., 1:] = differs
        last = np.ones(s.shape, dtype=bool)
        last[..., :-1] = differs
        start = np.maximum.accumulate(np.where(first, pos, 0), axis=-1)
        end = np.minimum.accumulate(np.where(last, pos, n_rows - 1)[..., ::-1], axis=-1)
        mid = 0.5 * (start + end[..., ::-1])
    sorted_rank = np.empty(s.shape)
    np.put_along_axis(sorted_rank, order, mid, axis=-1)
    rank = np.swapaxes(sorted_rank, -1, -2)
    n = live.sum(axis=-1)[..., None, None]
    scaled = np.where(n > 1, 2.0 * rank / np.maximum(n - 1, 1) - 1.0, 0.0)
    return np.where(live[..., None], scaled, 0.0)


def own_features(p: FloatArray, spec: AssetFeatureSpec) -> tuple[FloatArray, FloatArray]:
    """Each asset's own columns and its horizon sums ``(..., N, H)``: the environment computes
    them once per dataset, and only the cross-sectional part per episode."""
    r = log_returns(p)
    lookback = spec.lookback
    sums = np.stack([r[..., lookback - h :].sum(axis=-1) for h in spec.horizons], axis=-1)
    vol = r[..., lookback - spec.vol_window :].std(axis=-1)
    drawdown = np.log(p[..., -1] / p.max(axis=-1))
    own = np.concatenate(
        [r[..., lookback - spec.window :], sums, vol[..., None], drawdown[..., None]], axis=-1
    )
    return own, sums


def cross_sectional_features(sums: FloatArray, live: BoolArray) -> FloatArray:
    """Rank and market columns ``(..., N, 2H)`` from the horizon sums of the live assets; the
    market mean is summed sorted."""
    total = np.sort(np.where(live[..., None], sums, 0.0), axis=-2).sum(axis=-2)
    mean = total / np.maximum(live.sum(axis=-1)[..., None], 1)
    market = np.broadcast_to(mean[..., None, :], sums.shape)
    return np.concatenate([cross_sectional_rank(sums, live), market], axis=-1)


def asset_features(prices: ArrayLike, mask: ArrayLike, spec: AssetFeatureSpec) -> FloatArray:
    """Raw features ``(..., N, F)`` from closes ``(..., N, P)``, oldest first; N is any size."""
    p, live = live_price_window(prices, mask, spec.prices_per_asset)
    own, sums = own_features(p, spec)
    out = np.concatenate([own, cross_sectional_features(sums, live)], axis=-1)
    return np.where(live[..., None], out, 0.0)


def rolling_asset_features(
    prices: ArrayLike, spec: AssetFeatureSpec
) -> tuple[FloatArray, BoolArray]:
    """Features ``(T - lookback, N, F)`` at every date of closes ``(T, N)`` (row d: date
    ``lookback + d``) and the live assets: those with valid closes."""
    p = np.asarray(prices, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError(f"prices must be (T, N), got shape {p.shape}")
    n_prices = spec.prices_per_asset
    if p.shape[0] < n_prices:
        raise ValueError(f"need at least {n_prices} dates, got {p.shape[0]}")
    windows = sliding_window_view(p.T, n_prices, axis=-1).transpose(1, 0, 2)  # (D, N, P)
    valid = np.all(np.isfinite(windows) & (windows > 0), axis=-1)
    live = np.concatenate([np.ones((valid.shape[0], 1), bool), valid], axis=-1)
    per_date = max(1, p.shape[1] ** 2 * len(spec.horizons))
    step = max(1, _FIT_CHUNK_ELEMENTS // per_date)
    out = np.empty((valid.shape[0], p.shape[1], spec.n_features))
    for start in range(0, valid.shape[0], step):
        stop = start + step
        out[start:stop] = asset_features(windows[start:stop], live[start:stop], spec)
    return out, valid


def fit_feature_normalization(prices: ArrayLike, spec: AssetFeatureSpec) -> FeatureNormalization:
    """Mean and std of every feature over ``rolling_asset_features``' live rows. Fit on the
    training span only: later data would leak the future into every observation."""
    feats, live = rolling_asset_features(prices, spec)
    rows = feats[live]
    if rows.shape[0] == 0:
        raise ValueError(
            f"no asset has {spec.prices_per_asset} finite positive closes in the span: "
            "cannot fit the feature normalization"
        )
    mean = rows.mean(axis=0)
    std = rows.std(axis=0)
    std = np.where(std < STD_FLOOR, 1.0, std)
    return FeatureNormalization(mean=tuple(mean.tolist()), std=tuple(std.tolist()))


def normalize_features(
    raw: ArrayLike, norm: FeatureNormalization, clip: float, mask: ArrayLike
) -> NDArray[np.float32]:
    """``standardize`` as float32, masked rows zeroed; clipping keeps a crash day from
    saturating a tanh actor."""
    x = np.asarray(raw, dtype=np.float64)
    if x.ndim < 2 or x.shape[-1] != norm.n_features:
        raise ValueError(
            f"raw features shape {x.shape} must end with F = {norm.n_features} features"
        )
    live = live_mask(mask)[..., 1:]
    if live.shape[-1] != x.shape[-2]:
        raise ValueError(f"mask has {live.shape[-1] + 1} slots, expected {x.shape[-2] + 1}")
    z = standardize(x, norm.mean, norm.std, clip)
    return np.where(live[..., None], z, 0.0).astype(np.float32)


def standardize(
    raw: FloatArray, mean: Sequence[float], std: Sequence[float], clip: float
) -> FloatArray:
    """``(raw - mean) / std`` clipped; elementwise, so the environment may split the columns."""
    return np.clip((raw - np.asarray(mean)) / np.asarray(std), -clip, clip)


def build_asset_observation(
    prices: ArrayLike,
    weights: ArrayLike,
    mask: ArrayLike,
    spec: AssetFeatureSpec,
    norm: FeatureNormalization,
) -> NDArray[np.float32]:
    """``build_observation``'s layout with F features per slot instead of ``window`` returns."""
    if norm.n_features != spec.n_features:
        raise ValueError(
            f"normalization has {norm.n_features} features, the spec {spec.n_features}"
        )
    live = live_mask(mask)
    feats = normalize_features(asset_features(prices, live, spec), norm, spec.clip, live)
    layout = FeatureSpec(max_assets=feats.shape[-2], window=spec.n_features, clip=spec.clip)
    return assemble_observation(feats, weights, live, layout)
