"""The numpy-only policy contract that training, export, backtests and serving share."""

from allocator.portfolio.ids import CASH_ID, MAX_ID_LENGTH, MAX_VERSION_LENGTH, IdError, check_id
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
    WEIGHT_SUM_TOLERANCE,
    action_to_weights,
    is_distribution,
    live_mask,
    renormalize,
    weights_to_action,
)

__all__ = [
    "CASH",
    "CASH_ID",
    "MAX_ID_LENGTH",
    "MAX_VERSION_LENGTH",
    "WEIGHT_SUM_TOLERANCE",
    "FeatureSpec",
    "IdError",
    "NormalizationStats",
    "action_to_weights",
    "assemble_observation",
    "build_observation",
    "build_raw_observation",
    "check_id",
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
