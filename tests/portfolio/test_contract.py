"""The numpy policy contract: action -> weights, renormalization and smoothing (the
observation's contract: ``test_observation_contract.py``).

Expectations are derived from the contract itself (affine preference, renormalization),
never copied from the implementation's output.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from allocator.portfolio import (
    CASH,
    action_to_weights,
    ema_smooth,
    is_distribution,
    live_mask,
    renormalize,
)
from tests.portfolio.strategies import distribution

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
