"""The numpy-only policy contract that training, export, backtests and serving share."""

from allocator.portfolio.anchors import AnchorKind, AnchorSpec, anchor_weights, masked_anchor
from allocator.portfolio.features import (
    AssetFeatureSpec,
    FeatureNormalization,
    asset_features,
    build_asset_observation,
    cross_sectional_features,
    fit_feature_normalization,
    normalize_features,
    own_features,
    rolling_asset_features,
    standardize,
)
from allocator.portfolio.ids import CASH_ID, MAX_ID_LENGTH, MAX_VERSION_LENGTH, check_id, is_cash_id
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
from allocator.portfolio.smoothing import ema_smooth
from allocator.portfolio.tilt import (
    MAX_TILT_STRENGTH,
    apply_tilt,
    check_tilt_strength,
    tilt_weights,
)
from allocator.portfolio.weights import (
    CASH,
    WEIGHT_SUM_TOLERANCE,
    action_to_weights,
    is_distribution,
    live_mask,
    renormalize,
)

__all__ = [
    "CASH",
    "CASH_ID",
    "MAX_ID_LENGTH",
    "MAX_TILT_STRENGTH",
    "MAX_VERSION_LENGTH",
    "WEIGHT_SUM_TOLERANCE",
    "AnchorKind",
    "AnchorSpec",
    "AssetFeatureSpec",
    "FeatureNormalization",
    "FeatureSpec",
    "NormalizationStats",
    "action_to_weights",
    "anchor_weights",
    "apply_tilt",
    "assemble_observation",
    "asset_features",
    "build_asset_observation",
    "build_observation",
    "build_raw_observation",
    "check_id",
    "check_tilt_strength",
    "cross_sectional_features",
    "ema_smooth",
    "fit_feature_normalization",
    "fit_normalization",
    "is_cash_id",
    "is_distribution",
    "live_mask",
    "log_returns",
    "masked_anchor",
    "normalize_features",
    "normalize_observation",
    "normalize_returns",
    "own_features",
    "renormalize",
    "rolling_asset_features",
    "standardize",
    "tilt_weights",
]
