"""The raw observation an exported model takes, and its normalization, match build_observation."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.portfolio import (
    FeatureSpec,
    NormalizationStats,
    build_observation,
    build_raw_observation,
    normalize_observation,
)

SPEC = FeatureSpec(max_assets=3, window=4, clip=3.0)
STATS = NormalizationStats(mean=0.001, std=0.02)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), live=st.lists(st.booleans(), min_size=3, max_size=3))
def test_normalizing_the_raw_observation_gives_the_observation(seed, live):
    rng = np.random.default_rng(seed)
    prices = 50 * np.exp(np.cumsum(rng.normal(0, 0.05, size=(3, 5)), axis=1))
    mask = np.array([True, *live])
    prices[~mask[1:]] = np.nan  # masked rows may hold anything
    weights = np.where(mask, 1.0, 0.0) / mask.sum()
    raw = build_raw_observation(prices, weights, mask, SPEC)
    np.testing.assert_allclose(
        normalize_observation(raw, SPEC, STATS),
        build_observation(prices, weights, mask, SPEC, STATS),
        atol=1e-5,
    )


def test_raw_feature_block_holds_unnormalized_log_returns():
    prices = np.array([[1.0, 2.0, 4.0, 8.0, 16.0], [1.0] * 5, [np.nan] * 5])
    mask = np.array([1, 1, 1, 0])
    raw = build_raw_observation(prices, [0.25, 0.5, 0.25, 0.0], mask, SPEC)
    np.testing.assert_allclose(raw[:4], np.log(2.0), rtol=1e-6)  # doubling every day
    np.testing.assert_array_equal(raw[4:8], 0.0)  # flat prices
    np.testing.assert_array_equal(raw[8:12], 0.0)  # masked slot
    np.testing.assert_array_equal(raw[12:16], [0.25, 0.5, 0.25, 0.0])
    np.testing.assert_array_equal(raw[16:], [1, 1, 1, 0])
