"""The numpy-only policy contract that training, export, backtests and serving share."""

from allocator.portfolio.observation import (
    FeatureSpec,
    NormalizationStats,
    assemble_observation,
    build_observation,
    build_raw_observation,
    fit_normalization,
    log_returns,
    normalize_observation,
    normalize_returns,
)
from allocator.portfolio.smoothing import ema_smooth, validate_beta
from allocator.portfolio.weights import (
    CASH,
    action_to_weights,
    is_distribution,
    live_mask,
    renormalize,
    weights_to_action,
)

__all__ = [
    "CASH",
    "FeatureSpec",
    "NormalizationStats",
    "action_to_weights",
    "assemble_observation",
    "build_observation",
    "build_raw_observation",
    "ema_smooth",
    "fit_normalization",
    "is_distribution",
    "live_mask",
    "log_returns",
    "normalize_observation",
    "normalize_returns",
    "renormalize",
    "validate_beta",
    "weights_to_action",
]
