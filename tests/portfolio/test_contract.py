"""The numpy policy contract: action -> weights, smoothing, and the observation layout.

Expectations are derived from the contract itself (affine preference, renormalization, log
returns standardized then clipped), never copied from the implementation's output.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from allocator.portfolio import (
    CASH,
    FeatureSpec,
    NormalizationStats,
    action_to_weights,
    assemble_observation,
    build_observation,
    ema_smooth,
    fit_normalization,
    is_distribution,
    live_mask,
    log_returns,
    normalize_returns,
    renormalize,
)

ATOL = 1e-9

# ---------------------------------------------------------------------------------------------
# strategies

any_float = st.floats(allow_nan=True, allow_infinity=True, width=64)
unit_float = st.floats(0.0, 1.0, allow_nan=False, allow_infinity=False)
betas = st.floats(0.0, 1.0, exclude_max=True, allow_nan=False)
n_slots = st.integers(1, 9)


@st.composite
def action_and_mask(draw: st.DrawFn, elements: st.SearchStrategy[float] = any_float) -> tuple:
    """A 1-D action of arbitrary floats and an arbitrary boolean mask of the same length."""
    n = draw(n_slots)
    action = draw(hnp.arrays(np.float64, n, elements=elements))
    mask = draw(hnp.arrays(np.bool_, n))
    return action, mask


@st.composite
def distribution(draw: st.DrawFn, n: int, mask: np.ndarray | None = None) -> np.ndarray:
    """A probability vector of length ``n``, zero where ``mask`` is False (cash always live)."""
    raw = draw(hnp.arrays(np.float64, n, elements=unit_float))
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


def _all_cash(n: int) -> np.ndarray:
    out = np.zeros(n)
    out[CASH] = 1.0
    return out


def _assert_valid_weights(w: np.ndarray, mask: np.ndarray) -> None:
    live = np.asarray(mask, dtype=bool).copy()
    live[..., 0] = True
    assert np.all(np.isfinite(w))
    assert np.all(w >= 0.0)
    assert np.all(w[~live] == 0.0)
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=0.0, atol=ATOL)


# ---------------------------------------------------------------------------------------------
# action_to_weights: invariants


@given(action_and_mask())
def test_action_to_weights_is_a_distribution_on_live_slots(case: tuple) -> None:
    action, mask = case
    w = action_to_weights(action, mask)
    assert w.shape == action.shape
    _assert_valid_weights(w, mask)
    assert is_distribution(w, mask)


@given(action_and_mask())
def test_action_to_weights_is_proportional_to_clipped_affine_preference(case: tuple) -> None:
    action, mask = case
    live = mask.copy()
    live[0] = True
    # Preference from the contract, computed element by element in plain Python.
    pref = np.array(
        [
            0.0 if (math.isnan(a) or not m) else min(max((a + 1.0) / 2.0, 0.0), 1.0)
            for a, m in zip(action.tolist(), live.tolist(), strict=True)
        ]
    )
    w = action_to_weights(action, mask)
    if pref.sum() == 0.0:
        np.testing.assert_array_equal(w, _all_cash(len(action)))
    else:
        np.testing.assert_allclose(w, pref / pref.sum(), rtol=1e-12, atol=1e-15)


@given(action_and_mask(), st.data())
def test_masking_an_asset_moves_its_weight_only_into_renormalization(
    case: tuple, data: st.DataObject
) -> None:
    action, mask = case
    assume(len(action) >= 2)
    j = data.draw(st.integers(1, len(action) - 1), label="asset to mask")
    mask = mask.copy()
    mask[j] = True
    w = action_to_weights(action, mask)
    assume(w[j] < 1.0)
    fewer = mask.copy()
    fewer[j] = False
    w2 = action_to_weights(action, fewer)
    assert w2[j] == 0.0
    others = np.arange(len(action)) != j
    # w2[i] == w[i] / (1 - w[j]), written multiplicatively to stay well conditioned.
    np.testing.assert_allclose(w2[others] * (1.0 - w[j]), w[others], rtol=1e-12, atol=1e-15)


@given(st.data(), st.integers(1, 5), n_slots)
def test_batched_action_to_weights_matches_row_by_row(
    data: st.DataObject, rows: int, n: int
) -> None:
    actions = data.draw(hnp.arrays(np.float64, (rows, n), elements=any_float), label="actions")
    masks = data.draw(hnp.arrays(np.bool_, (rows, n)), label="masks")
    batched = action_to_weights(actions, masks)
    assert batched.shape == (rows, n)
    for r in range(rows):
        np.testing.assert_allclose(
            batched[r], action_to_weights(actions[r], masks[r]), rtol=1e-15, atol=0.0
        )


@given(st.data(), st.integers(1, 3), st.integers(1, 3), n_slots)
def test_action_to_weights_accepts_several_leading_dims(
    data: st.DataObject, d0: int, d1: int, n: int
) -> None:
    actions = data.draw(hnp.arrays(np.float64, (d0, d1, n), elements=any_float))
    masks = data.draw(hnp.arrays(np.bool_, (d0, d1, n)))
    w = action_to_weights(actions, masks)
    assert w.shape == (d0, d1, n)
    _assert_valid_weights(w, masks)
    np.testing.assert_allclose(w[d0 - 1, d1 - 1], action_to_weights(actions[-1, -1], masks[-1, -1]))


# ---------------------------------------------------------------------------------------------
# action_to_weights: degenerate cases


def test_all_live_actions_at_minus_one_give_all_cash() -> None:
    # Masked slot 3 wants everything, but it is masked: nothing live is wanted -> cash.
    w = action_to_weights([-1.0, -1.0, -1.0, 1.0], [True, True, True, False])
    np.testing.assert_array_equal(w, [1.0, 0.0, 0.0, 0.0])


def test_all_nan_actions_give_all_cash() -> None:
    w = action_to_weights([np.nan] * 4, [True] * 4)
    np.testing.assert_array_equal(w, [1.0, 0.0, 0.0, 0.0])


def test_empty_mask_gives_all_cash() -> None:
    # Cash is forced live even when the mask says otherwise, and takes everything.
    w = action_to_weights([-0.5, 1.0, 1.0], [False, False, False])
    np.testing.assert_array_equal(w, [1.0, 0.0, 0.0])


def test_cash_is_live_even_when_mask_says_masked() -> None:
    # Cash preference 1, asset preference 1 -> half each, although mask[0] is False.
    w = action_to_weights([1.0, 1.0, 1.0], [False, True, False])
    np.testing.assert_allclose(w, [0.5, 0.5, 0.0])


def test_infinite_actions_saturate() -> None:
    # +inf behaves like +1 (preference 1), -inf like -1 (preference 0).
    w = action_to_weights([np.inf, -np.inf, 1.0, np.inf], [True] * 4)
    np.testing.assert_allclose(w, [1 / 3, 0.0, 1 / 3, 1 / 3], rtol=0, atol=1e-15)
    np.testing.assert_array_equal(
        action_to_weights([5.0, np.inf], [True, True]), action_to_weights([1.0, 1.0], [1, 1])
    )
    np.testing.assert_array_equal(
        action_to_weights([0.0, -np.inf, -7.0], [True] * 3), [1.0, 0.0, 0.0]
    )


def test_nan_counts_as_zero_preference_next_to_valid_actions() -> None:
    # Preferences: cash (0+1)/2 = 0.5, NaN -> 0, asset 2 (0.5+1)/2 = 0.75; total 1.25.
    w = action_to_weights([0.0, np.nan, 0.5], [True, True, True])
    np.testing.assert_allclose(w, [0.4, 0.0, 0.6], rtol=0, atol=1e-15)


def test_affine_mapping_on_a_hand_computed_example() -> None:
    # Preferences 0.5, 1.0, 0.25, (masked) -> total 1.75.
    w = action_to_weights([0.0, 1.0, -0.5, 0.9], [True, True, True, False])
    np.testing.assert_allclose(w, [0.5 / 1.75, 1.0 / 1.75, 0.25 / 1.75, 0.0], atol=1e-15)


def test_one_asset_can_take_everything() -> None:
    w = action_to_weights([-1.0, -1.0, 1.0], [True, True, True])
    np.testing.assert_array_equal(w, [0.0, 0.0, 1.0])


def test_mask_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="shape"):
        action_to_weights([0.0, 0.0, 0.0], [True, True])


def test_mask_without_any_slot_raises() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        live_mask(np.zeros(0, dtype=bool))


# ---------------------------------------------------------------------------------------------
# renormalize and is_distribution


def test_renormalize_scales_live_nonnegative_entries() -> None:
    # Negative and NaN count as zero, the masked 4.0 is dropped; live total 1 + 3 = 4.
    w = renormalize([1.0, -2.0, np.nan, 3.0, 4.0], [True, True, True, True, False])
    np.testing.assert_allclose(w, [0.25, 0.0, 0.0, 0.75, 0.0], atol=1e-15)


def test_renormalize_of_nothing_is_all_cash() -> None:
    np.testing.assert_array_equal(renormalize([0.0, 0.0, 5.0], [True, True, False]), [1, 0, 0])
    rows = renormalize([[0.0, 0.0], [1.0, 3.0]], [[True, True], [True, True]])
    np.testing.assert_allclose(rows, [[1.0, 0.0], [0.25, 0.75]])


@given(st.data(), n_slots)
def test_renormalize_output_is_a_distribution_for_bounded_input(
    data: st.DataObject, n: int
) -> None:
    x = data.draw(hnp.arrays(np.float64, n, elements=st.floats(-1e6, 1e6)))
    mask = data.draw(hnp.arrays(np.bool_, n))
    _assert_valid_weights(renormalize(x, mask), mask)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_renormalize_of_huge_finite_entries_is_still_a_distribution() -> None:
    w = renormalize([0.0, 1e308, 1e308], [True, True, True])
    np.testing.assert_allclose(w, [0.0, 0.5, 0.5])


def test_is_distribution_accepts_valid_and_rejects_invalid_weights() -> None:
    assert is_distribution([0.25, 0.75, 0.0])
    assert is_distribution([0.25, 0.75, 0.0], [True, True, False])
    assert not is_distribution([0.25, 0.5, 0.25], [True, True, False])  # mass on a masked slot
    assert not is_distribution([0.5, 0.6, 0.0])  # sums to 1.1
    assert not is_distribution([1.5, -0.5, 0.0])  # negative entry
    assert not is_distribution([np.nan, 1.0, 0.0])


# ---------------------------------------------------------------------------------------------
# every distribution is some action's weights


def preference_action(weights: np.ndarray) -> np.ndarray:
    """An action ``action_to_weights`` maps back to ``weights``: preference w / max(w)."""
    top = np.max(weights, axis=-1, keepdims=True)
    return np.divide(weights, top, out=np.zeros_like(weights), where=top > 0) * 2.0 - 1.0


@given(st.data(), n_slots)
def test_every_distribution_is_reached_by_an_action(data: st.DataObject, n: int) -> None:
    mask = data.draw(hnp.arrays(np.bool_, n), label="mask")
    w = data.draw(distribution(n, mask), label="weights")
    action = preference_action(w)
    assert np.all(action >= -1.0)
    assert np.all(action <= 1.0)
    np.testing.assert_allclose(action_to_weights(action, mask), w, rtol=0.0, atol=1e-12)


@given(st.data(), st.integers(1, 4), n_slots)
def test_every_distribution_is_reached_batched(data: st.DataObject, rows: int, n: int) -> None:
    masks = data.draw(hnp.arrays(np.bool_, (rows, n)), label="masks")
    w = np.stack([data.draw(distribution(n, masks[r])) for r in range(rows)])
    np.testing.assert_allclose(
        action_to_weights(preference_action(w), masks), w, rtol=0.0, atol=1e-12
    )


# ---------------------------------------------------------------------------------------------
# ema_smooth


@given(st.data(), n_slots, betas)
def test_smoothing_keeps_distribution_for_any_previous(
    data: st.DataObject, n: int, beta: float
) -> None:
    action = data.draw(hnp.arrays(np.float64, n, elements=any_float), label="action")
    mask = data.draw(hnp.arrays(np.bool_, n), label="mask")
    previous = data.draw(distribution(n), label="previous (may sit on masked slots)")
    w = action_to_weights(action, mask)
    s = ema_smooth(previous, w, mask, beta)
    _assert_valid_weights(s, mask)

    live = mask.copy()
    live[0] = True
    blend = np.where(live, beta * previous + (1.0 - beta) * w, 0.0)
    np.testing.assert_allclose(s, blend / blend.sum(), rtol=1e-9, atol=1e-12)


@given(st.data(), n_slots)
def test_smoothing_with_beta_zero_is_the_mapped_weights(data: st.DataObject, n: int) -> None:
    action = data.draw(hnp.arrays(np.float64, n, elements=any_float), label="action")
    mask = data.draw(hnp.arrays(np.bool_, n), label="mask")
    previous = data.draw(distribution(n), label="previous")
    w = action_to_weights(action, mask)
    np.testing.assert_allclose(ema_smooth(previous, w, mask, 0.0), w, rtol=0.0, atol=1e-12)


@given(st.data(), n_slots, betas)
def test_smoothing_without_previous_starts_at_the_weights(
    data: st.DataObject, n: int, beta: float
) -> None:
    action = data.draw(hnp.arrays(np.float64, n, elements=any_float), label="action")
    mask = data.draw(hnp.arrays(np.bool_, n), label="mask")
    w = action_to_weights(action, mask)
    np.testing.assert_allclose(ema_smooth(None, w, mask, beta), w, rtol=0.0, atol=1e-12)


def test_smoothing_on_a_hand_computed_example() -> None:
    # 0.25 * [1, 0, 0] + 0.75 * [0, 1, 0] = [0.25, 0.75, 0].
    s = ema_smooth([1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [True, True, True], 0.25)
    np.testing.assert_allclose(s, [0.25, 0.75, 0.0], atol=1e-15)


def test_smoothing_drops_mass_previously_held_on_a_masked_asset() -> None:
    # Blend 0.5 * [0, 0, 1] + 0.5 * [0.5, 0.5, 0] = [0.25, 0.25, 0.5]; slot 2 closes -> [.5, .5, 0].
    s = ema_smooth([0.0, 0.0, 1.0], [0.5, 0.5, 0.0], [True, True, False], 0.5)
    np.testing.assert_allclose(s, [0.5, 0.5, 0.0], atol=1e-15)


@pytest.mark.parametrize("beta", [-0.1, -1e-12, 1.0, 1.5, np.inf, -np.inf, np.nan])
def test_smoothing_beta_outside_unit_interval_raises(beta: float) -> None:
    with pytest.raises(ValueError, match="beta"):
        ema_smooth([1.0, 0.0], [0.0, 1.0], [True, True], beta)
    with pytest.raises(ValueError, match="beta"):
        ema_smooth(None, [0.0, 1.0], [True, True], beta)


def test_smoothing_previous_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="shape"):
        ema_smooth([1.0, 0.0], [0.0, 1.0, 0.0], [True, True, True], 0.5)


# ---------------------------------------------------------------------------------------------
# observation


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
