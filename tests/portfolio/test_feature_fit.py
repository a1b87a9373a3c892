"""Features over a history and the normalization fitted on a training span."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import allocator.portfolio.features as features_module
from allocator.portfolio import (
    asset_features,
    fit_feature_normalization,
    normalize_features,
    rolling_asset_features,
)
from tests.portfolio.strategies import SMALL_SPEC, daily_return

SPEC = SMALL_SPEC
L = SPEC.lookback


@st.composite
def history(draw: st.DrawFn, max_dates: int = 25, max_assets: int = 4) -> np.ndarray:
    """Closes ``(T, N)``; each asset may list late or delist early (NaN outside its life)."""
    t = draw(st.integers(SPEC.prices_per_asset, max_dates), label="dates")
    n = draw(st.integers(1, max_assets), label="assets")
    r = draw(hnp.arrays(np.float64, (t, n), elements=daily_return))
    prices = 10.0 * np.exp(np.cumsum(r, axis=0))
    for i in range(n):
        first = draw(st.integers(0, t - 1), label=f"first date of {i}")
        last = draw(st.integers(first, t - 1), label=f"last date of {i}")
        prices[:first, i] = np.nan
        prices[last + 1 :, i] = np.nan
    return prices


def reference_rows(prices: np.ndarray) -> np.ndarray:
    """Every (date, live asset) feature row, date by date from the one-date function."""
    rows = []
    for t in range(L, prices.shape[0]):
        window = prices[t - L : t + 1].T
        live = np.all(np.isfinite(window) & (window > 0), axis=1)
        feats = asset_features(window, np.concatenate([[True], live]), SPEC)
        rows.extend(feats[live])
    return np.array(rows).reshape(-1, SPEC.n_features)


@given(history())
def test_rolling_features_are_the_one_date_features_of_each_window(prices: np.ndarray) -> None:
    feats, live = rolling_asset_features(prices, SPEC)
    assert feats.shape == (prices.shape[0] - L, prices.shape[1], SPEC.n_features)
    for d in range(feats.shape[0]):
        window = prices[d : d + L + 1].T
        expected_live = np.all(np.isfinite(window), axis=1)
        np.testing.assert_array_equal(live[d], expected_live)
        expected = asset_features(window, np.concatenate([[True], expected_live]), SPEC)
        np.testing.assert_array_equal(feats[d], expected)


@given(history(), st.data())
def test_features_at_a_date_never_see_later_closes(prices: np.ndarray, data: st.DataObject) -> None:
    d = data.draw(st.integers(0, prices.shape[0] - L - 1), label="row")
    before, _ = rolling_asset_features(prices, SPEC)
    changed = prices.copy()
    changed[L + d + 1 :] *= 3.0
    after, _ = rolling_asset_features(changed, SPEC)
    np.testing.assert_array_equal(after[: d + 1], before[: d + 1])


@settings(max_examples=50)
@given(history())
def test_fit_is_the_mean_and_std_over_live_asset_dates(prices: np.ndarray) -> None:
    rows = reference_rows(prices)
    if rows.shape[0] == 0:
        with pytest.raises(ValueError, match="cannot fit"):
            fit_feature_normalization(prices, SPEC)
        return
    norm = fit_feature_normalization(prices, SPEC)
    std = rows.std(axis=0)
    np.testing.assert_allclose(norm.mean, rows.mean(axis=0), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(
        norm.std, np.where(std < features_module.STD_FLOOR, 1.0, std), rtol=1e-9, atol=1e-15
    )


def test_fit_on_a_span_ignores_everything_after_it_but_uses_its_last_date() -> None:
    rng = np.random.default_rng(11)
    prices = 50.0 * np.exp(np.cumsum(rng.normal(0.0, 0.02, (60, 3)), axis=0))
    span = 40
    fitted = fit_feature_normalization(prices[:span], SPEC)
    later = prices.copy()
    later[span:] = later[span:] ** 1.5  # a different future
    assert fit_feature_normalization(later[:span], SPEC) == fitted
    assert fit_feature_normalization(prices, SPEC) != fitted  # later data would change it
    last = prices[:span].copy()
    last[-1, 0] *= 1.3
    assert fit_feature_normalization(last, SPEC) != fitted


def test_a_constant_feature_gets_std_one() -> None:
    rng = np.random.default_rng(2)
    prices = np.exp(np.cumsum(rng.normal(0.0, 0.02, (30, 1)), axis=0))
    norm = fit_feature_normalization(prices, SPEC)  # one asset: every rank is 0
    rank_cols = [SPEC.names.index(f"rank_{h}") for h in SPEC.horizons]
    assert all(norm.std[c] == 1.0 and norm.mean[c] == 0.0 for c in rank_cols)
    assert all(0.0 < norm.std[c] < 1.0 for c in range(SPEC.window))


def test_rolling_features_in_small_chunks_equal_one_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(8)
    prices = np.exp(np.cumsum(rng.normal(0.0, 0.02, (40, 5)), axis=0))
    prices[:12, 2] = np.nan
    whole, live = rolling_asset_features(prices, SPEC)
    monkeypatch.setattr(features_module, "_FIT_CHUNK_ELEMENTS", 100)  # 1 date per chunk
    chunked, live_chunked = rolling_asset_features(prices, SPEC)
    np.testing.assert_array_equal(chunked, whole)
    np.testing.assert_array_equal(live_chunked, live)


def test_a_history_shorter_than_the_lookback_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 7 dates"):
        rolling_asset_features(np.ones((6, 2)), SPEC)


def test_fitted_normalization_standardizes_the_training_features() -> None:
    rng = np.random.default_rng(9)
    prices = 20.0 * np.exp(np.cumsum(rng.normal(0.0005, 0.02, (80, 4)), axis=0))
    norm = fit_feature_normalization(prices, SPEC)
    feats, live = rolling_asset_features(prices, SPEC)
    mask = np.concatenate([np.ones((live.shape[0], 1), bool), live], axis=1)
    z = normalize_features(feats, norm, 1e6, mask)[live].astype(np.float64)
    np.testing.assert_allclose(z.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(z.std(axis=0), 1.0, atol=1e-5)
