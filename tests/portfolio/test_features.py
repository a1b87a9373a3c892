"""Per-asset features: checked against a direct plain-Python reference, not the implementation.

The reference recomputes each feature from the definition (loops, ``math``, ``statistics``);
the rank reference sorts with average ranks for ties on the implementation's own horizon sums,
so a tie decided by the last bit of a sum cannot make the comparison flaky.
"""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from allocator.portfolio import (
    AssetFeatureSpec,
    FeatureNormalization,
    asset_features,
    build_asset_observation,
    cross_sectional_features,
    normalize_features,
    own_features,
)
from allocator.portfolio.features import cross_sectional_rank
from tests.portfolio.strategies import SMALL_SPEC, permutation, universe

SPEC = SMALL_SPEC
W, H = SPEC.window, len(SPEC.horizons)
SUMS = slice(W, W + H)
VOL, DRAWDOWN = W + H, W + H + 1
RANKS = slice(W + H + 2, W + 2 * H + 2)
MARKET = slice(W + 2 * H + 2, W + 3 * H + 2)


def reference_rank(values: list[float]) -> list[float]:
    """Average 0-based ranks with ties, scaled to [-1, 1]; 0 for a single value."""
    n = len(values)
    if n == 1:
        return [0.0]
    order = sorted(values)
    out = []
    for v in values:
        first = order.index(v)
        last = n - 1 - order[::-1].index(v)
        out.append(2.0 * ((first + last) / 2.0) / (n - 1) - 1.0)
    return out


def reference_row(closes: list[float], spec: AssetFeatureSpec) -> list[float]:
    """The own-asset features of one row (returns, sums, vol, drawdown) from the definition."""
    closes = closes[len(closes) - spec.prices_per_asset :]
    r = [math.log(closes[t] / closes[t - 1]) for t in range(1, len(closes))]
    row = r[len(r) - spec.window :]
    row += [math.fsum(r[len(r) - h :]) for h in spec.horizons]
    row.append(statistics.pstdev(r[len(r) - spec.vol_window :]))
    row.append(math.log(closes[-1] / max(closes)))
    return row


def assert_matches_reference(
    prices: np.ndarray, mask: np.ndarray, feats: np.ndarray, spec: AssetFeatureSpec
) -> None:
    w, h = spec.window, len(spec.horizons)
    live = [i for i in range(prices.shape[0]) if mask[i + 1]]
    for i in range(prices.shape[0]):
        if i not in live:
            assert np.all(feats[i] == 0.0), f"masked row {i} is not zero"
            continue
        np.testing.assert_allclose(
            feats[i, : w + h + 2], reference_row(prices[i].tolist(), spec), rtol=1e-9, atol=1e-12
        )
    for k in range(h):
        sums = [float(feats[i, w + k]) for i in live]
        if not sums:
            continue
        expected_rank = reference_rank(sums)
        market = math.fsum(sums) / len(sums)
        for j, i in enumerate(live):
            assert feats[i, w + h + 2 + k] == pytest.approx(expected_rank[j], abs=1e-12)
            assert feats[i, w + 2 * h + 2 + k] == pytest.approx(market, rel=1e-9, abs=1e-15)


# ---------------------------------------------------------------------------------------------
# the spec


def test_default_spec_has_the_documented_shape() -> None:
    spec = AssetFeatureSpec()
    assert spec.lookback == 30
    assert spec.prices_per_asset == 31
    assert spec.n_features == 30 + 3 * 4 + 2 == len(spec.names)
    assert spec.names[:2] == ("ret_0", "ret_1")
    assert spec.names[29] == "ret_29"
    assert spec.names[30:] == (
        *("sum_5", "sum_10", "sum_20", "sum_30"),
        "vol_20",
        "drawdown",
        *("rank_5", "rank_10", "rank_20", "rank_30"),
        *("market_5", "market_10", "market_20", "market_30"),
    )


def test_column_positions_used_here_are_the_named_features() -> None:
    names = SPEC.names
    assert names[W - 1] == f"ret_{W - 1}"
    assert names[SUMS] == tuple(f"sum_{h}" for h in SPEC.horizons)
    assert names[VOL] == f"vol_{SPEC.vol_window}"
    assert names[DRAWDOWN] == "drawdown"
    assert names[RANKS] == tuple(f"rank_{h}" for h in SPEC.horizons)
    assert names[MARKET] == tuple(f"market_{h}" for h in SPEC.horizons)


def test_lookback_is_the_longest_window() -> None:
    assert AssetFeatureSpec(window=5, horizons=(3, 60), vol_window=20).lookback == 60
    assert AssetFeatureSpec(window=5, horizons=(3,), vol_window=40).prices_per_asset == 41
    assert AssetFeatureSpec(window=50, horizons=(3,), vol_window=4).lookback == 50


def test_spec_round_trips_through_json() -> None:
    spec = AssetFeatureSpec(window=7, horizons=(3, 9), vol_window=5, clip=4.0)
    again = AssetFeatureSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec
    assert isinstance(again.horizons, tuple)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"window": 0}, "window"),
        ({"horizons": ()}, "horizon"),
        ({"horizons": (0, 5)}, "horizons"),
        ({"horizons": (5, 5)}, "distinct"),
        ({"vol_window": 0}, "vol_window"),
        ({"clip": 0.0}, "clip"),
        ({"version": 2}, "version 2 is not supported"),
    ],
)
def test_spec_refuses_bad_values(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AssetFeatureSpec(**kwargs)


def test_spec_from_dict_refuses_unknown_fields() -> None:
    with pytest.raises(ValueError, match="horizon"):
        AssetFeatureSpec.from_dict({"window": 5, "horizon": [5]})


# ---------------------------------------------------------------------------------------------
# raw features


@given(universe())
def test_features_match_the_reference(case: tuple) -> None:
    prices, mask = case
    feats = asset_features(prices, mask, SPEC)
    assert feats.shape == (prices.shape[0], SPEC.n_features)
    assert feats.dtype == np.float64
    assert_matches_reference(prices, mask, feats, SPEC)


def test_rank_and_market_on_a_hand_made_example() -> None:
    # Constant daily log returns g per asset: sum_h = h * g exactly enough to rank by g.
    spec = AssetFeatureSpec(window=2, horizons=(2, 4), vol_window=2)
    growth = np.array([0.01, 0.03, 0.01, 0.02, 0.5])
    prices = np.exp(np.outer(growth, np.arange(spec.prices_per_asset)))
    mask = np.array([1, 1, 1, 1, 1, 0], dtype=bool)  # the 0.5 asset is masked
    feats = asset_features(prices, mask, spec)
    ranks = feats[:, 6:8]  # ret 0-1, sum 2-3, vol 4, drawdown 5, rank 6-7, market 8-9
    # Live sums rank 0.01, 0.01 (tied: 0.5), 0.02 (2), 0.03 (3) among n = 4: 2r/3 - 1.
    expected = np.array([-2 / 3, 1.0, -2 / 3, 1 / 3, 0.0])
    np.testing.assert_allclose(ranks, np.stack([expected, expected], axis=1), atol=1e-12)
    market = feats[:, -2:]
    np.testing.assert_allclose(market[:4, 0], 2 * np.mean(growth[:4]), rtol=1e-9)
    np.testing.assert_allclose(market[:4, 1], 4 * np.mean(growth[:4]), rtol=1e-9)
    assert np.all(feats[4] == 0.0)
    np.testing.assert_allclose(feats[:4, 4], 0.0, atol=1e-15)  # constant returns: no vol


def test_a_lone_live_asset_has_rank_zero_and_is_its_own_market() -> None:
    prices = np.exp(np.linspace(0.0, 0.3, SPEC.prices_per_asset))[None, :]
    feats = asset_features(np.vstack([prices, prices * 2]), [1, 1, 0], SPEC)
    assert np.all(feats[0, RANKS] == 0.0)
    np.testing.assert_array_equal(feats[0, MARKET], feats[0, SUMS])


def test_drawdown_is_the_fall_from_the_window_high() -> None:
    closes = [100.0, 120.0, 150.0, 90.0, 100.0, 110.0, 105.0]  # 7 closes = SPEC's lookback + 1
    feats = asset_features(np.array([[50.0, *closes]]), [1, 1], SPEC)  # 50 is outside the window
    assert feats[0, DRAWDOWN] == pytest.approx(math.log(105.0 / 150.0), rel=1e-12)
    rising = asset_features(np.array([np.arange(1.0, 8.0)]), [1, 1], SPEC)
    assert rising[0, DRAWDOWN] == 0.0


@given(universe(), st.data())
def test_permuting_live_assets_permutes_the_rows_exactly(case: tuple, data: st.DataObject) -> None:
    prices, mask = case
    perm = data.draw(permutation(prices.shape[0]))
    feats = asset_features(prices, mask, SPEC)
    moved = asset_features(prices[perm], np.concatenate([[True], mask[1:][perm]]), SPEC)
    np.testing.assert_array_equal(moved, feats[perm])


@given(universe(), st.data())
def test_masked_rows_never_influence_live_rows(case: tuple, data: st.DataObject) -> None:
    prices, mask = case
    feats = asset_features(prices, mask, SPEC)
    masked = np.flatnonzero(~mask[1:])
    other = prices.copy()
    other[masked] = data.draw(st.sampled_from([np.nan, 7.0, -3.0]))
    np.testing.assert_array_equal(asset_features(other, mask, SPEC), feats)


@given(universe())
def test_older_closes_do_not_change_the_features(case: tuple) -> None:
    prices, mask = case
    longer = np.concatenate([np.full((prices.shape[0], 3), np.nan), prices], axis=1)
    np.testing.assert_array_equal(
        asset_features(longer, mask, SPEC), asset_features(prices, mask, SPEC)
    )


@given(st.lists(universe(max_assets=4, extra=0), min_size=1, max_size=4))
def test_a_batch_equals_its_items(cases: list) -> None:
    n = max(p.shape[0] for p, _ in cases)
    prices = np.full((len(cases), n, SPEC.prices_per_asset), np.nan)
    masks = np.zeros((len(cases), n + 1), dtype=bool)
    for b, (p, m) in enumerate(cases):
        prices[b, : p.shape[0]] = p
        masks[b, : m.shape[0]] = m
    batch = asset_features(prices, masks, SPEC)
    for b in range(len(cases)):
        np.testing.assert_array_equal(batch[b], asset_features(prices[b], masks[b], SPEC))


def test_features_work_for_any_universe_size() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 2, 12, 40):
        prices = np.exp(np.cumsum(rng.normal(0, 0.02, (n, SPEC.prices_per_asset)), axis=1))
        feats = asset_features(prices, np.ones(n + 1, bool), SPEC)
        assert feats.shape == (n, SPEC.n_features)
        assert np.all(np.isfinite(feats))
        assert np.all(np.abs(feats[:, RANKS]) <= 1.0)


@pytest.mark.parametrize("bad", [np.nan, 0.0, -1.0, np.inf])
def test_a_bad_live_close_names_its_slot(bad: float) -> None:
    prices = np.ones((3, SPEC.prices_per_asset))
    prices[1, -2] = bad
    with pytest.raises(ValueError, match="live slot 2"):
        asset_features(prices, [1, 1, 1, 1], SPEC)


def test_shape_errors_are_reported() -> None:
    with pytest.raises(ValueError, match="slots"):
        asset_features(np.ones((3, SPEC.prices_per_asset)), [1, 1, 1], SPEC)
    with pytest.raises(ValueError, match="at least 7 prices"):
        asset_features(np.ones((3, 6)), [1, 1, 1, 1], SPEC)


# ---------------------------------------------------------------------------------------------
# normalization and the flat observation


def unit_normalization(spec: AssetFeatureSpec) -> FeatureNormalization:
    return FeatureNormalization(mean=(0.0,) * spec.n_features, std=(1.0,) * spec.n_features)


def test_normalize_features_standardizes_clips_and_zeroes_masked_rows() -> None:
    norm = FeatureNormalization(mean=(1.0, -2.0), std=(2.0, 0.5))
    raw = np.array([[3.0, -2.0], [100.0, -100.0], [5.0, 5.0]])
    out = normalize_features(raw, norm, 10.0, [1, 1, 1, 0])
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.array([[1.0, 0.0], [10.0, -10.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="F = 2"):
        normalize_features(np.ones((3, 3)), norm, 10.0, [1, 1, 1, 1])


def test_normalization_round_trips_and_refuses_bad_statistics() -> None:
    norm = FeatureNormalization(mean=(0.5, -1.0), std=(2.0, 1e-3))
    assert FeatureNormalization.from_dict(json.loads(json.dumps(norm.to_dict()))) == norm
    bad = [
        ((0.0,), (0.0,), "std"),
        ((np.nan,), (1.0,), "mean must be finite"),
        ((0.0, 1.0), (1.0,), "same length"),
        ((), (), "same length"),
    ]
    for mean, std, match in bad:
        with pytest.raises(ValueError, match=match):
            FeatureNormalization(mean=mean, std=std)


@given(universe(extra=0), st.data())
def test_observation_layout_is_slot_major_then_weights_then_mask(
    case: tuple, data: st.DataObject
) -> None:
    prices, mask = case
    m, f = prices.shape[0], SPEC.n_features
    norm = FeatureNormalization(
        mean=tuple(np.linspace(-0.1, 0.1, f)), std=tuple(np.linspace(0.01, 0.3, f))
    )
    weights = np.linspace(1.0, 2.0, m + 1) / np.linspace(1.0, 2.0, m + 1).sum()
    obs = build_asset_observation(prices, weights, mask, SPEC, norm)
    assert obs.dtype == np.float32
    assert obs.shape == (m * f + 2 * (m + 1),)
    expected = normalize_features(asset_features(prices, mask, SPEC), norm, SPEC.clip, mask)
    for slot in range(1, m + 1):
        np.testing.assert_array_equal(obs[(slot - 1) * f : slot * f], expected[slot - 1])
        if not mask[slot]:
            assert np.all(obs[(slot - 1) * f : slot * f] == 0.0)
    np.testing.assert_array_equal(obs[m * f : m * f + m + 1], weights.astype(np.float32))
    np.testing.assert_array_equal(obs[m * f + m + 1 :], mask.astype(np.float32))
    assert np.all(np.abs(obs[: m * f]) <= SPEC.clip)


def test_observation_refuses_a_normalization_of_another_size() -> None:
    prices = np.ones((2, SPEC.prices_per_asset))
    norm = FeatureNormalization(mean=(0.0,) * 3, std=(1.0,) * 3)
    with pytest.raises(ValueError, match="normalization has 3 features"):
        build_asset_observation(prices, [1.0, 0.0, 0.0], [1, 1, 1], SPEC, norm)


def test_batched_observation_equals_its_rows() -> None:
    rng = np.random.default_rng(5)
    prices = np.exp(np.cumsum(rng.normal(0, 0.02, (3, 4, SPEC.prices_per_asset)), axis=-1))
    masks = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 1, 0], [0, 0, 0, 0, 0]], dtype=bool)
    weights = np.full((3, 5), 0.2)
    norm = unit_normalization(SPEC)
    batch = build_asset_observation(prices, weights, masks, SPEC, norm)
    assert batch.shape == (3, 4 * SPEC.n_features + 10)
    for b in range(3):
        row = build_asset_observation(prices[b], weights[b], masks[b], SPEC, norm)
        np.testing.assert_array_equal(batch[b], row)


def pairwise_rank(values: np.ndarray, live: np.ndarray) -> np.ndarray:
    """The rank column by its definition: live values below, plus half the ties, scaled."""
    vi, vj = values[..., :, None, :], values[..., None, :, :]
    other = live[..., None, :, None]
    rank = np.sum(other & (vj < vi), axis=-2) + 0.5 * (np.sum(other & (vj == vi), axis=-2) - 1)
    n = live.sum(axis=-1)[..., None, None]
    scaled = np.where(n > 1, 2.0 * rank / np.maximum(n - 1, 1) - 1.0, 0.0)
    return np.where(live[..., None], scaled, 0.0)


@given(
    shape=st.tuples(st.integers(1, 4), st.integers(1, 9), st.integers(1, 3)),
    seed=st.integers(0, 2**32 - 1),
)
def test_sorted_ranks_equal_the_pairwise_definition_with_ties_and_masks(
    shape: tuple[int, int, int], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    values = rng.integers(-2, 3, size=shape).astype(float)  # few distinct values: many ties
    live = rng.random(shape[:2]) < 0.7
    values[~live] = np.nan  # masked rows may hold anything
    expected = pairwise_rank(np.where(live[..., None], values, 0.0), live)
    np.testing.assert_array_equal(cross_sectional_rank(values, live), expected)


def test_features_are_the_own_columns_then_the_cross_sectional_ones() -> None:
    rng = np.random.default_rng(5)
    prices = 50.0 * np.exp(np.cumsum(rng.normal(0, 0.02, (4, SPEC.prices_per_asset)), axis=1))
    mask = np.ones(5, dtype=bool)
    own, sums = own_features(prices, SPEC)
    assert own.shape == (4, SPEC.n_own_features)
    np.testing.assert_array_equal(own[:, SUMS], sums)
    live = mask[1:]
    expected = np.concatenate([own, cross_sectional_features(sums, live)], axis=-1)
    np.testing.assert_array_equal(asset_features(prices, mask, SPEC), expected)
