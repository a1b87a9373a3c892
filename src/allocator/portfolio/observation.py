"""The observation a policy sees: a flat float32 vector of ``M * W`` asset features (per slot,
the W latest daily log returns, oldest first, normalized and clipped; zeros on masked slots),
``M + 1`` weights and ``M + 1`` mask entries (cash first, always live).

A tanh actor fed raw returns of order 1e-2 next to weights of order 1 saturates, so returns
are normalized with training-window statistics that travel in the model's manifest.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from allocator.portfolio.weights import BoolArray, FloatArray, live_mask

Float32Array = NDArray[np.float32]


@dataclass(frozen=True)
class FeatureSpec:
    """Shape of the observation: how many asset slots and how many returns per slot."""

    max_assets: int
    window: int = 30
    clip: float = 10.0

    def __post_init__(self) -> None:
        if self.max_assets < 1:
            raise ValueError(f"max_assets must be >= 1, got {self.max_assets}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if not self.clip > 0:
            raise ValueError(f"clip must be > 0, got {self.clip}")

    @property
    def n_slots(self) -> int:
        """Length of every action, weight and mask vector (cash + assets)."""
        return self.max_assets + 1

    @property
    def prices_per_asset(self) -> int:
        return self.window + 1

    @property
    def obs_size(self) -> int:
        return self.max_assets * self.window + 2 * self.n_slots


@dataclass(frozen=True)
class NormalizationStats:
    """Mean and standard deviation of daily log returns over the training period."""

    mean: float
    std: float

    def __post_init__(self) -> None:
        if not (np.isfinite(self.mean) and np.isfinite(self.std) and self.std > 0):
            raise ValueError(f"invalid normalization stats mean={self.mean} std={self.std}")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def log_returns(prices: ArrayLike, axis: int = -1) -> NDArray[np.float64]:
    """Daily log returns along ``axis``; one fewer entry than prices on that axis."""
    p = np.moveaxis(np.asarray(prices, dtype=np.float64), axis, -1)
    return np.moveaxis(np.log(p[..., 1:] / p[..., :-1]), -1, axis)


def live_price_window(
    prices: ArrayLike, mask: ArrayLike, n_prices: int
) -> tuple[FloatArray, BoolArray]:
    """The last ``n_prices`` closes ``(..., N, P)`` with masked rows set to 1, and the live
    assets; a live close not finite and positive raises (NaN features would poison the net)."""
    p = np.asarray(prices, dtype=np.float64)
    if p.ndim < 2:
        raise ValueError(f"prices must be (..., N, P), got shape {p.shape}")
    live = live_mask(mask)[..., 1:]
    if live.shape[-1] != p.shape[-2]:
        raise ValueError(
            f"mask has {live.shape[-1] + 1} slots, expected N + 1 = {p.shape[-2] + 1} "
            f"for prices of shape {p.shape}"
        )
    if p.shape[-1] < n_prices:
        raise ValueError(f"need at least {n_prices} prices per asset, got {p.shape[-1]}")
    p = p[..., p.shape[-1] - n_prices :]
    if p.shape[:-2] != live.shape[:-1]:  # broadcasting costs the request path; rarely needed
        batch = np.broadcast_shapes(p.shape[:-2], live.shape[:-1])
        p = np.broadcast_to(p, (*batch, *p.shape[-2:]))
        live = np.broadcast_to(live, (*batch, live.shape[-1]))
    bad = live[..., None] & ~(np.isfinite(p) & (p > 0))
    if np.any(bad):
        where = np.argwhere(bad)[0]
        at = f" (batch index {tuple(int(i) for i in where[:-2])})" if len(where) > 2 else ""
        raise ValueError(
            f"prices for live slot {int(where[-2]) + 1}{at} must be finite and positive"
        )
    return np.where(live[..., None], p, 1.0), live


def fit_normalization(prices: ArrayLike, axis: int = 0) -> NormalizationStats:
    """Fit the return statistics on a (training-period) price array; NaN prices are ignored."""
    r = log_returns(prices, axis=axis)
    r = r[np.isfinite(r)]
    if r.size < 2:
        raise ValueError("need at least two finite returns to fit normalization")
    return NormalizationStats(mean=float(r.mean()), std=float(r.std()))


def normalize_returns(
    returns: ArrayLike, stats: NormalizationStats, clip: float
) -> NDArray[np.float32]:
    """Standardize and clip log returns, elementwise."""
    z = (np.asarray(returns, dtype=np.float64) - stats.mean) / stats.std
    return np.clip(z, -clip, clip).astype(np.float32)


def assemble_observation(
    features: ArrayLike, weights: ArrayLike, mask: ArrayLike, spec: FeatureSpec
) -> Float32Array:
    """Features ``(..., max_assets, window)`` (masked slots zeroed), then weights, then mask."""
    live = live_mask(mask)
    w = np.asarray(weights, dtype=np.float32)
    if live.shape[-1] != spec.n_slots or w.shape[-1] != spec.n_slots:
        raise ValueError(
            f"weights {w.shape} and mask {live.shape} must have n_slots = max_assets + 1 = "
            f"{spec.n_slots} entries"
        )
    f = np.asarray(features, dtype=np.float32)
    if f.shape[-2:] != (spec.max_assets, spec.window):
        raise ValueError(
            f"features shape {f.shape[-2:]} != (max_assets, window) "
            f"{(spec.max_assets, spec.window)}"
        )
    f = np.where(live[..., 1:, None], f, np.float32(0.0))
    batch = f.shape[:-2]
    return np.concatenate(
        [
            f.reshape(*batch, spec.max_assets * spec.window),
            np.broadcast_to(w, (*batch, spec.n_slots)),
            np.broadcast_to(live.astype(np.float32), (*batch, spec.n_slots)),
        ],
        axis=-1,
    )


def _checked_log_returns(
    prices: ArrayLike, live: NDArray[np.bool_], spec: FeatureSpec
) -> NDArray[np.float64]:
    if live.shape[-1] != spec.n_slots:
        raise ValueError(f"mask has {live.shape[-1]} entries, expected {spec.n_slots}")
    p = np.asarray(prices, dtype=np.float64)
    if p.shape[-2:] != (spec.max_assets, spec.prices_per_asset):
        raise ValueError(
            f"prices shape {p.shape[-2:]} != (max_assets, window + 1) "
            f"{(spec.max_assets, spec.prices_per_asset)}"
        )
    return log_returns(live_price_window(p, live, spec.prices_per_asset)[0])


def build_observation(
    prices: ArrayLike,
    weights: ArrayLike,
    mask: ArrayLike,
    spec: FeatureSpec,
    stats: NormalizationStats,
) -> Float32Array:
    """The observation of closes ``(..., max_assets, window + 1)``, oldest first; masked rows
    may hold anything, live ones must be finite and positive."""
    live = live_mask(mask)
    features = normalize_returns(_checked_log_returns(prices, live, spec), stats, spec.clip)
    return assemble_observation(features, weights, live, spec)


def build_raw_observation(
    prices: ArrayLike, weights: ArrayLike, mask: ArrayLike, spec: FeatureSpec
) -> Float32Array:
    """``build_observation`` with raw log returns: an exported model's input (its graph
    normalizes, as ``normalize_observation`` does)."""
    live = live_mask(mask)
    return assemble_observation(_checked_log_returns(prices, live, spec), weights, live, spec)


def normalize_observation(
    raw: ArrayLike, spec: FeatureSpec, stats: NormalizationStats
) -> Float32Array:
    """Apply the normalization to a raw observation's feature block (masked slots stay 0)."""
    obs = np.array(raw, dtype=np.float32)
    n = spec.max_assets * spec.window
    mask = obs[..., n + spec.n_slots :]
    feats = normalize_returns(obs[..., :n], stats, spec.clip)
    live = np.repeat(mask[..., 1:] > 0.5, spec.window, axis=-1)
    obs[..., :n] = np.where(live, feats, np.float32(0.0))
    return obs
