"""The numpy policy contract's observation: layout, normalized log returns, and the checks on
prices, weights and mask.

Expectations are derived from the contract (log returns standardized then clipped, slots then
oldest return first), never copied from the implementation's output.
"""

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from allocator.portfolio import (
    FeatureSpec,
    NormalizationStats,
    assemble_observation,
    build_observation,
    fit_normalization,
    live_mask,
    log_returns,
    normalize_returns,
)
from tests.portfolio.strategies import distribution

ATOL = 1e-9


def test_feature_spec_sizes() -> None:
    spec = FeatureSpec(max_assets=3, window=4)
    assert spec.n_slots == 4
    assert spec.prices_per_asset == 5
    assert spec.obs_size == 3 * 4 + 4 + 4


@pytest.mark.parametrize(
    "kwargs", [{"max_assets": 0}, {"max_assets": 2, "window": 0}, {"max_assets": 2, "clip": 0.0}]
)
def test_feature_spec_rejects_invalid_values(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="must be"):
        FeatureSpec(**kwargs)


@pytest.mark.parametrize(("mean", "std"), [(0.0, 0.0), (0.0, -1.0), (np.nan, 1.0), (0.0, np.inf)])
def test_normalization_stats_reject_invalid_values(mean: float, std: float) -> None:
    with pytest.raises(ValueError, match="invalid normalization stats"):
        NormalizationStats(mean, std)


def test_observation_layout_and_size() -> None:
    spec = FeatureSpec(max_assets=3, window=4, clip=10.0)
    stats = NormalizationStats(mean=0.0, std=1.0)
    prices = np.full((3, 5), 50.0)  # flat prices -> zero returns -> zero features
    weights = np.array([0.1, 0.2, 0.3, 0.4])
    mask = np.array([False, True, True, True])  # cash forced live in the output
    obs = build_observation(prices, weights, mask, spec, stats)
    assert obs.dtype == np.float32
    assert obs.shape == (3 * 4 + 2 * 4,)
    np.testing.assert_array_equal(obs[:12], np.zeros(12))
    np.testing.assert_array_equal(obs[12:16], weights.astype(np.float32))
    np.testing.assert_array_equal(obs[16:20], [1.0, 1.0, 1.0, 1.0])


def test_observation_equals_hand_computed_normalized_log_returns() -> None:
    spec = FeatureSpec(max_assets=2, window=3, clip=10.0)
    stats = NormalizationStats(mean=0.001, std=0.02)
    prices = np.array(
        [
            [100.0, 102.0, 99.96, 101.9592],  # +2%, -2%, +2%
            [np.nan, np.nan, np.nan, np.nan],  # masked slot: NaN accepted
        ]
    )
    weights = [0.25, 0.75, 0.0]
    obs = build_observation(prices, weights, [True, True, False], spec, stats)
    up = (math.log(1.02) - 0.001) / 0.02
    down = (math.log(0.98) - 0.001) / 0.02
    expected = [up, down, up, 0.0, 0.0, 0.0, 0.25, 0.75, 0.0, 1.0, 1.0, 0.0]
    np.testing.assert_allclose(obs, expected, rtol=1e-6, atol=1e-6)


def test_observation_orders_slots_then_oldest_return_first() -> None:
    spec = FeatureSpec(max_assets=2, window=2, clip=100.0)
    stats = NormalizationStats(mean=0.0, std=1.0)
    e = math.e
    # Slot 1 log returns (1, 2); slot 2 log returns (-1, 3).
    prices = np.array([[1.0, e, e**3], [e, 1.0, e**3]])
    obs = build_observation(prices, [1.0, 0.0, 0.0], [True, True, True], spec, stats)
    np.testing.assert_allclose(obs[:4], [1.0, 2.0, -1.0, 3.0], rtol=1e-6)


def test_observation_zeroes_masked_slots_even_with_valid_prices() -> None:
    spec = FeatureSpec(max_assets=2, window=2)
    stats = NormalizationStats(mean=0.0, std=0.01)
    prices = np.array([[1.0, 2.0, 4.0], [1.0, 3.0, 9.0]])
    obs = build_observation(prices, [0.5, 0.5, 0.0], [True, True, False], spec, stats)
    assert np.all(obs[:2] != 0.0)
    np.testing.assert_array_equal(obs[2:4], [0.0, 0.0])


def test_observation_clips_normalized_returns() -> None:
    spec = FeatureSpec(max_assets=1, window=3, clip=2.5)
    stats = NormalizationStats(mean=0.0, std=0.01)
    # log returns: ln 100 (z = 460), ln 0.01 (z = -460), ln 1.01 (z ~ 0.995, inside the clip).
    prices = np.array([[1.0, 100.0, 1.0, 1.01]])
    obs = build_observation(prices, [0.0, 1.0], [True, True], spec, stats)
    np.testing.assert_allclose(obs[:3], [2.5, -2.5, math.log(1.01) / 0.01], rtol=1e-6)


@pytest.mark.parametrize("bad", [np.nan, 0.0, -3.0, np.inf])
def test_observation_rejects_bad_live_prices_naming_the_slot(bad: float) -> None:
    spec = FeatureSpec(max_assets=3, window=2)
    stats = NormalizationStats(mean=0.0, std=0.01)
    prices = np.full((3, 3), 10.0)
    prices[1, 1] = bad  # asset slot 2 (row 1)
    with pytest.raises(ValueError, match="slot 2"):
        build_observation(prices, [1.0, 0.0, 0.0, 0.0], [True] * 4, spec, stats)
    # The same row is fine once slot 2 is masked.
    obs = build_observation(prices, [1.0, 0.0, 0.0, 0.0], [True, True, False, True], spec, stats)
    np.testing.assert_array_equal(obs[2:4], [0.0, 0.0])


@pytest.mark.parametrize("shape", [(2, 3), (3, 2), (3, 4), (4, 3), (9,)])
def test_observation_rejects_wrong_price_shape(shape: tuple[int, ...]) -> None:
    spec = FeatureSpec(max_assets=3, window=2)
    stats = NormalizationStats(mean=0.0, std=0.01)
    with pytest.raises(ValueError, match="shape"):
        build_observation(np.ones(shape), [1.0, 0.0, 0.0, 0.0], [True] * 4, spec, stats)


def test_observation_rejects_wrong_weights_length() -> None:
    spec = FeatureSpec(max_assets=2, window=2)
    stats = NormalizationStats(mean=0.0, std=0.01)
    with pytest.raises(ValueError, match="weights"):
        build_observation(np.ones((2, 3)), [1.0, 0.0], [True, True, True], spec, stats)


def test_observation_rejects_wrong_mask_length() -> None:
    spec = FeatureSpec(max_assets=2, window=2)
    stats = NormalizationStats(mean=0.0, std=0.01)
    with pytest.raises(ValueError, match="mask"):
        build_observation(np.ones((2, 3)), [1.0, 0.0, 0.0], [True, True], spec, stats)


def test_assemble_observation_rejects_wrong_feature_shape() -> None:
    spec = FeatureSpec(max_assets=2, window=3)
    with pytest.raises(ValueError, match="features shape"):
        assemble_observation(np.zeros((2, 2)), [1.0, 0.0, 0.0], [True] * 3, spec)


@given(st.data(), st.integers(1, 4))
def test_batched_observation_matches_row_by_row(data: st.DataObject, rows: int) -> None:
    spec = FeatureSpec(max_assets=3, window=2, clip=3.0)
    stats = NormalizationStats(mean=0.0, std=0.05)
    prices = data.draw(
        hnp.arrays(np.float64, (rows, 3, 3), elements=st.floats(0.5, 2.0)), label="prices"
    )
    masks = data.draw(hnp.arrays(np.bool_, (rows, 4)), label="masks")
    weights = np.stack([data.draw(distribution(4, masks[r])) for r in range(rows)])
    prices = np.where(live_mask(masks)[:, 1:, None], prices, np.nan)  # masked rows: NaN
    obs = build_observation(prices, weights, masks, spec, stats)
    assert obs.shape == (rows, spec.obs_size)
    for r in range(rows):
        np.testing.assert_array_equal(
            obs[r], build_observation(prices[r], weights[r], masks[r], spec, stats)
        )


def test_log_returns_along_an_axis() -> None:
    p = np.array([[1.0, 10.0], [2.0, 5.0], [8.0, 5.0]])  # dates x assets
    expected = np.array([[math.log(2.0), math.log(0.5)], [math.log(4.0), 0.0]])
    np.testing.assert_allclose(log_returns(p, axis=0), expected, atol=1e-15)
    np.testing.assert_allclose(log_returns(p.T), expected.T, atol=1e-15)


def test_normalize_returns_standardizes_then_clips() -> None:
    stats = NormalizationStats(mean=0.01, std=0.02)
    z = normalize_returns([0.01, 0.03, -0.05, 1.0], stats, clip=2.0)
    assert z.dtype == np.float32
    np.testing.assert_allclose(z, [0.0, 1.0, -2.0, 2.0], atol=1e-6)


@given(
    hnp.arrays(
        np.float64, st.tuples(st.integers(2, 12), st.integers(1, 4)), elements=st.floats(1.0, 1e3)
    ),
    st.data(),
)
def test_fit_normalization_matches_numpy_on_finite_log_returns(
    prices: np.ndarray, data: st.DataObject
) -> None:
    holes = data.draw(hnp.arrays(np.bool_, prices.shape), label="NaN positions")
    prices = np.where(holes, np.nan, prices)
    # Independently: each asset's consecutive-close log returns, NaN pairs dropped, pooled.
    pooled = []
    for col in prices.T:
        for a, b in itertools.pairwise(col):
            if math.isfinite(a) and math.isfinite(b):
                pooled.append(math.log(b / a))
    r = np.array(pooled)
    if len(r) < 2:
        with pytest.raises(ValueError, match="two finite returns"):
            fit_normalization(prices)
        return
    assume(np.std(r) > 1e-6)
    stats = fit_normalization(prices, axis=0)
    assert stats.mean == pytest.approx(np.mean(r), rel=1e-9, abs=1e-12)
    assert stats.std == pytest.approx(np.std(r), rel=1e-9, abs=1e-12)


def test_fit_normalization_on_a_hand_computed_example() -> None:
    # Asset A: returns ln 2, ln 2; asset B lists late: return ln 0.5 only. Pooled: ln2 * [1, 1, -1].
    prices = np.array([[1.0, np.nan], [2.0, 4.0], [4.0, 2.0]])
    stats = fit_normalization(prices, axis=0)
    ln2 = math.log(2.0)
    mean = ln2 / 3.0
    std = math.sqrt(((ln2 - mean) ** 2 * 2 + (-ln2 - mean) ** 2) / 3.0)
    assert stats.mean == pytest.approx(mean, rel=1e-12)
    assert stats.std == pytest.approx(std, rel=1e-12)


def test_fit_normalization_needs_two_finite_returns() -> None:
    with pytest.raises(ValueError, match="two finite returns"):
        fit_normalization(np.array([[1.0], [2.0], [np.nan]]))
