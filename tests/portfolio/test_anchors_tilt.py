"""Anchor portfolios and the tilt mapping, checked against their definitions."""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from allocator.portfolio import (
    MAX_TILT_STRENGTH,
    AnchorKind,
    AnchorSpec,
    anchor_weights,
    apply_tilt,
    is_distribution,
    masked_anchor,
    tilt_weights,
)
from tests.portfolio.strategies import permutation, universe

VOL_WINDOW = 3
N_PRICES = VOL_WINDOW + 2  # one close more than the inverse-volatility anchor needs
cash_shares = st.sampled_from([0.0, 0.05, 0.3, 0.999])
anchor_specs = st.builds(
    AnchorSpec, kind=st.sampled_from(list(AnchorKind)), cash_share=cash_shares
).map(lambda s: AnchorSpec(kind=s.kind, cash_share=s.cash_share, vol_window=VOL_WINDOW))
strengths = st.sampled_from([0.0, 0.1, 1.0, 2.5, 10.0, MAX_TILT_STRENGTH])
any_action = st.floats(allow_nan=True, allow_infinity=True, width=64)


@st.composite
def tilt_case(draw: st.DrawFn) -> tuple:
    """Closes, mask, anchor spec and an action of arbitrary floats (NaN and inf included)."""
    prices, mask = draw(universe(n_prices=N_PRICES))
    spec = draw(anchor_specs)
    action = draw(hnp.arrays(np.float64, mask.shape, elements=any_action))
    return prices, mask, spec, action


def assert_distribution(w: np.ndarray, mask: np.ndarray, atol: float = 1e-12) -> None:
    live = mask.copy()
    live[..., 0] = True
    assert np.all(np.isfinite(w))
    assert np.all(w >= 0.0)
    assert np.all(w[~live] == 0.0)
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=0.0, atol=atol)


def permuted_mask(mask: np.ndarray, perm: np.ndarray) -> np.ndarray:
    return np.concatenate([[True], mask[1:][perm]])


def permuted_slots(v: np.ndarray, perm: np.ndarray) -> np.ndarray:
    return np.concatenate([v[:1], v[1:][perm]])


# ---------------------------------------------------------------------------------------------
# anchors


def test_anchor_spec_coerces_kind_and_round_trips() -> None:
    spec = AnchorSpec(kind="inverse_volatility", cash_share=0.1, vol_window=5)  # type: ignore[arg-type]
    assert spec.kind is AnchorKind.INVERSE_VOLATILITY
    assert AnchorSpec(**json.loads(json.dumps(spec.to_dict()))) == spec
    bad_values = [
        ({"cash_share": 1.0}, "cash_share"),
        ({"cash_share": -0.1}, "cash_share"),
        ({"vol_window": 0}, "vol_window"),
        ({"kind": "risk_parity"}, "risk_parity"),
    ]
    for bad, match in bad_values:
        with pytest.raises(ValueError, match=match):
            AnchorSpec(**bad)  # type: ignore[arg-type]


@given(universe(n_prices=N_PRICES), cash_shares)
def test_equal_anchor_keeps_its_cash_share_and_splits_the_rest(case: tuple, c: float) -> None:
    prices, mask = case
    w = anchor_weights(prices, mask, AnchorSpec(cash_share=c))
    n_live = int(mask[1:].sum())
    expected = np.where(mask, (1.0 - c) / max(n_live, 1), 0.0)
    expected[0] = c if n_live else 1.0
    np.testing.assert_allclose(w, expected, rtol=1e-12, atol=1e-15)
    assert_distribution(w, mask)


@given(universe(n_prices=N_PRICES), cash_shares)
def test_inverse_volatility_anchor_follows_the_definition(case: tuple, c: float) -> None:
    prices, mask = case
    spec = AnchorSpec(kind=AnchorKind.INVERSE_VOLATILITY, cash_share=c, vol_window=VOL_WINDOW)
    w = anchor_weights(prices, mask, spec)
    inverse = []
    for i in range(prices.shape[0]):
        if not mask[i + 1]:
            inverse.append(0.0)
            continue
        closes = prices[i, -(VOL_WINDOW + 1) :].tolist()
        r = [math.log(closes[t] / closes[t - 1]) for t in range(1, len(closes))]
        inverse.append(1.0 / max(statistics.pstdev(r), 1e-8))
    total = math.fsum(inverse)
    expected = [c if total else 1.0] + [(1.0 - c) * x / total if total else 0.0 for x in inverse]
    np.testing.assert_allclose(w, expected, rtol=1e-9, atol=1e-15)
    assert_distribution(w, mask)


def test_inverse_volatility_gives_the_calmer_asset_more() -> None:
    calm = np.exp(np.array([0.0, 0.01, 0.0, 0.01]))
    wild = np.exp(np.array([0.0, 0.04, 0.0, 0.04]))
    flat = np.ones(4)
    spec = AnchorSpec(kind=AnchorKind.INVERSE_VOLATILITY, cash_share=0.0, vol_window=3)
    w = anchor_weights(np.stack([calm, wild]), [1, 1, 1], spec)
    np.testing.assert_allclose(w[1:], [0.8, 0.2], rtol=1e-9)
    w = anchor_weights(np.stack([calm, flat]), [1, 1, 1], spec)  # sigma 0 floored: finite
    assert np.all(np.isfinite(w))
    assert w[2] > 0.999


@given(universe(n_prices=N_PRICES), anchor_specs, st.data())
def test_permuting_live_assets_permutes_the_anchor_exactly(
    case: tuple, spec: AnchorSpec, data: st.DataObject
) -> None:
    prices, mask = case
    perm = data.draw(permutation(prices.shape[0]))
    w = anchor_weights(prices, mask, spec)
    moved = anchor_weights(prices[perm], permuted_mask(mask, perm), spec)
    np.testing.assert_array_equal(moved, permuted_slots(w, perm))


def test_anchor_with_no_live_asset_is_all_cash() -> None:
    for kind in AnchorKind:
        spec = AnchorSpec(kind=kind, vol_window=VOL_WINDOW)
        w = anchor_weights(np.full((3, N_PRICES), np.nan), [1, 0, 0, 0], spec)
        np.testing.assert_array_equal(w, [1.0, 0.0, 0.0, 0.0])


def test_batched_anchor_equals_its_rows() -> None:
    rng = np.random.default_rng(1)
    prices = np.exp(np.cumsum(rng.normal(0, 0.02, (4, 3, N_PRICES)), axis=-1))
    masks = rng.random((4, 4)) < 0.7
    spec = AnchorSpec(kind=AnchorKind.INVERSE_VOLATILITY, vol_window=VOL_WINDOW)
    batch = anchor_weights(prices, masks, spec)
    for b in range(4):
        np.testing.assert_array_equal(batch[b], anchor_weights(prices[b], masks[b], spec))


# ---------------------------------------------------------------------------------------------
# tilt


@given(tilt_case(), strengths)
def test_a_zero_action_is_the_anchor_bit_for_bit(case: tuple, k: float) -> None:
    prices, mask, spec, _ = case
    anchor = anchor_weights(prices, mask, spec)
    np.testing.assert_array_equal(tilt_weights(np.zeros_like(anchor), anchor, mask, k), anchor)
    np.testing.assert_array_equal(
        tilt_weights(np.full_like(anchor, np.nan), anchor, mask, k), anchor
    )


@given(tilt_case(), strengths)
def test_tilt_weights_are_a_distribution_on_live_slots(case: tuple, k: float) -> None:
    prices, mask, spec, action = case
    w = tilt_weights(action, anchor_weights(prices, mask, spec), mask, k)
    assert w.shape == action.shape
    assert_distribution(w, mask)
    assert is_distribution(w, mask)


@given(tilt_case(), strengths)
def test_tilt_is_the_anchor_times_exp_k_a_renormalized(case: tuple, k: float) -> None:
    prices, mask, spec, action = case
    anchor = anchor_weights(prices, mask, spec)
    a = [0.0 if math.isnan(x) else min(max(x, -1.0), 1.0) for x in action.tolist()]
    # Ratios w_i / w_j = anchor_i / anchor_j * exp(k (a_i - a_j)), relative to the largest
    # tilted slot so that the reference itself cannot underflow to 0 / 0.
    top = max(k * a[i] for i in range(len(a)) if anchor[i] > 0)
    z = [anchor[i] * math.exp(k * a[i] - top) if mask[i] or i == 0 else 0.0 for i in range(len(a))]
    expected = np.array(z) / math.fsum(z)
    np.testing.assert_allclose(
        tilt_weights(action, anchor, mask, k), expected, rtol=1e-9, atol=1e-14
    )


def test_tilt_saturates_outside_the_action_range() -> None:
    anchor, mask = np.array([0.1, 0.3, 0.6]), np.ones(3, bool)
    inside = tilt_weights([1.0, -1.0, 0.25], anchor, mask, 2.0)
    np.testing.assert_array_equal(tilt_weights([7.0, -np.inf, 0.25], anchor, mask, 2.0), inside)
    np.testing.assert_array_equal(tilt_weights([np.inf, -3.0, 0.25], anchor, mask, 2.0), inside)


def test_a_strong_tilt_with_all_actions_at_minus_one_is_still_the_anchor() -> None:
    # Every exp(k a) is 1e-43: 1 + sum(anchor * (exp(k a) - 1)) cancels to nothing, and the
    # mapping must still return the anchor (equal tilts cancel).
    anchor, mask = np.array([0.05, 0.45, 0.5]), np.ones(3, bool)
    w = tilt_weights(-np.ones(3), anchor, mask, MAX_TILT_STRENGTH)
    np.testing.assert_allclose(w, anchor, rtol=1e-12)
    w = tilt_weights([-1.0, -1.0, -0.9], anchor, mask, MAX_TILT_STRENGTH)
    np.testing.assert_allclose(w, [0.0, 0.0, 1.0], atol=1e-4)
    assert w[0] > 0
    assert w[0] / w[1] == pytest.approx(0.05 / 0.45, rel=1e-9)


@given(tilt_case(), strengths, st.data())
def test_permuting_live_slots_permutes_the_weights_exactly(
    case: tuple, k: float, data: st.DataObject
) -> None:
    prices, mask, spec, action = case
    perm = data.draw(permutation(prices.shape[0]))
    anchor = anchor_weights(prices, mask, spec)
    w = tilt_weights(action, anchor, mask, k)
    moved = tilt_weights(
        permuted_slots(action, perm),
        permuted_slots(anchor, perm),
        permuted_mask(mask, perm),
        k,
    )
    np.testing.assert_array_equal(moved, permuted_slots(w, perm))


@given(tilt_case(), strengths, st.data())
def test_masked_slots_actions_and_anchor_mass_are_ignored(
    case: tuple, k: float, data: st.DataObject
) -> None:
    prices, mask, spec, action = case
    anchor = anchor_weights(prices, mask, spec)
    w = tilt_weights(action, anchor, mask, k)
    other = action.copy()
    other[~mask] = data.draw(any_action, label="masked action")
    np.testing.assert_array_equal(tilt_weights(other, anchor, mask, k), w)
    # Anchor mass on a masked slot is dropped and the live part renormalized.
    leaky = anchor * 0.5
    leaky[~mask] = 0.5 / max(int((~mask).sum()), 1)
    np.testing.assert_allclose(tilt_weights(action, leaky, mask, k), w, rtol=1e-12, atol=1e-15)


def test_masked_anchor_keeps_a_live_distribution_bit_for_bit() -> None:
    anchor = np.array([0.1, 0.2, 0.7, 0.0]) / 1.0
    np.testing.assert_array_equal(masked_anchor(anchor, [1, 1, 1, 0]), anchor)
    np.testing.assert_allclose(masked_anchor(anchor, [1, 0, 1, 1]), [0.125, 0.0, 0.875, 0.0])
    np.testing.assert_array_equal(masked_anchor([0.0, np.nan, -1.0], [1, 1, 1]), [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(masked_anchor([0.0, 0.5, 0.5], [1, 0, 0]), [1.0, 0.0, 0.0])


def test_batched_tilt_broadcasts_one_anchor_and_mask() -> None:
    rng = np.random.default_rng(6)
    actions = rng.uniform(-1.5, 1.5, (5, 4))
    anchor, mask = np.array([0.1, 0.3, 0.6, 0.0]), np.array([1, 1, 1, 0], bool)
    batch = tilt_weights(actions, anchor, mask, 1.5)
    for b in range(5):
        np.testing.assert_array_equal(batch[b], tilt_weights(actions[b], anchor, mask, 1.5))


def test_k_zero_ignores_the_action_and_bad_k_is_refused() -> None:
    anchor, mask = np.array([0.2, 0.3, 0.5]), np.ones(3, bool)
    np.testing.assert_array_equal(tilt_weights([1.0, -1.0, 0.3], anchor, mask, 0.0), anchor)
    for k in (-0.1, math.inf, math.nan, MAX_TILT_STRENGTH * 2):
        with pytest.raises(ValueError, match="tilt strength"):
            tilt_weights([0.0, 0.0, 0.0], anchor, mask, k)
    with pytest.raises(ValueError, match="slots"):
        tilt_weights([0.0, 0.0], anchor, mask, 1.0)


def test_one_vector_tilt_is_the_batched_tilt_bit_for_bit() -> None:
    """The environment's one-vector path of ``apply_tilt`` gives the bits of the batched path
    (the server's), for clipped, NaN and cancelling actions and every strength."""
    rng = np.random.default_rng(0)
    base = rng.dirichlet(np.ones(9))
    base[4] = 0.0  # a masked slot
    base /= base.sum()
    cases = [rng.uniform(-1.5, 1.5, 9) for _ in range(300)]
    cancelling = -np.ones(9)
    cancelling[2] = 1.0  # most mass on -1: the 1 + sum form cancels at large k
    with_nan = rng.uniform(-1, 1, 9)
    with_nan[3] = np.nan
    cases += [cancelling, with_nan, np.zeros(9)]
    for i, action in enumerate(cases):
        k = (0.0, 0.5, 3.0, 25.0)[i % 4]
        one = apply_tilt(action.astype(np.float32), base, k)
        batch = apply_tilt(action.astype(np.float32)[None], base[None], k)[0]
        assert one.tobytes() == batch.tobytes(), (i, k)
