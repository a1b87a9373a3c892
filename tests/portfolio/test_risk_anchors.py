"""Minimum-variance and HRP anchors, their Ledoit-Wolf risk model, against scikit-learn, scipy and
skfolio (reference implementations the numpy-only contract may not import)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.cluster.hierarchy import leaves_list, linkage
from scipy.spatial.distance import squareform
from skfolio.cluster import HierarchicalClustering, LinkageMethod
from skfolio.distance import CovarianceDistance
from skfolio.moments import LedoitWolf
from skfolio.optimization import HierarchicalRiskParity, MeanRisk, ObjectiveFunction
from skfolio.prior import EmpiricalPrior
from skfolio.seriation import HierarchicalSeriation
from sklearn.covariance import ledoit_wolf as sklearn_ledoit_wolf

from allocator.portfolio import AnchorKind, AnchorSpec, anchor_weights, log_returns
from allocator.portfolio.hrp import correlation_distance, hrp_weights, single_linkage_order
from allocator.portfolio.min_variance import min_variance_weights, nnls_normal
from allocator.portfolio.tilt import VOL_FLOOR, ledoit_wolf, risk_covariance
from tests.portfolio.strategies import permutation, universe

RISK_KINDS = [AnchorKind.MIN_VARIANCE, AnchorKind.HRP]
WINDOW = 6
SHAPES = [(1, 20), (2, 20), (7, 20), (20, 20), (30, 20), (12, 60), (3, 2)]
"""(assets, returns): one asset, fewer returns than assets (a singular sample), more."""


def market_returns(n: int, t: int, seed: int) -> np.ndarray:
    """Daily log returns ``(n, t)`` with a common factor, so correlations are not ~0."""
    rng = np.random.default_rng(seed)
    return rng.normal(0.0, 0.02, (n, t)) * rng.uniform(0.5, 2.0, (n, 1)) + rng.normal(
        0.0, 0.01, (1, t)
    )


def closes_of(returns: np.ndarray) -> np.ndarray:
    return 50.0 * np.exp(np.concatenate([np.zeros((returns.shape[0], 1)), returns], 1).cumsum(1))


def skfolio_prior() -> EmpiricalPrior:
    return EmpiricalPrior(covariance_estimator=LedoitWolf(nearest=False))


def skfolio_hrp(returns: np.ndarray) -> np.ndarray:
    """skfolio's HRP with the anchor's settings: shrunk covariance, its correlation distance,
    single linkage, leaves in the dendrogram's own order."""
    model = HierarchicalRiskParity(
        prior_estimator=skfolio_prior(),
        distance_estimator=CovarianceDistance(covariance_estimator="precomputed"),
        seriation_estimator=HierarchicalSeriation(
            hierarchical_clustering_estimator=HierarchicalClustering(
                linkage_method=LinkageMethod.SINGLE
            ),
            optimal_ordering=False,
        ),
    )
    return model.fit(returns.T).weights_


def skfolio_min_variance(returns: np.ndarray) -> np.ndarray:
    """skfolio's long-only minimum variance on the shrunk covariance, solved to 1e-12."""
    tight = {"tol_gap_abs": 1e-12, "tol_gap_rel": 1e-12, "tol_feas": 1e-12, "tol_ktratio": 1e-10}
    model = MeanRisk(
        objective_function=ObjectiveFunction.MINIMIZE_RISK,
        prior_estimator=skfolio_prior(),
        solver_params=tight,
    )
    return model.fit(returns.T).weights_


def canonical(returns: np.ndarray) -> np.ndarray:
    """Rows sorted lexicographically: the order the anchors compute in."""
    return returns[np.lexsort(returns.T[::-1])]


def assert_min_variance_kkt(cov: np.ndarray, w: np.ndarray, rtol: float = 1e-9) -> None:
    """KKT of min w'Sw, sum w = 1, w >= 0: every held asset's marginal variance (Sw)_i equals
    w'Sw, and no asset left out has a lower one."""
    assert np.all(w >= 0.0)
    assert w.sum() == pytest.approx(1.0, abs=1e-12)
    marginal, variance = cov @ w, w @ cov @ w
    held = w > 0
    np.testing.assert_allclose(marginal[held], variance, rtol=rtol)
    assert np.all(marginal[~held] >= variance * (1.0 - rtol))


# ---------------------------------------------------------------------------------------------
# the risk model


@pytest.mark.parametrize(("n", "t"), SHAPES)
def test_ledoit_wolf_is_scikit_learns(n: int, t: int) -> None:
    returns = market_returns(n, t, seed=n * 100 + t)
    cov, shrinkage = ledoit_wolf(returns)
    expected, expected_shrinkage = sklearn_ledoit_wolf(returns.T)
    np.testing.assert_allclose(cov, expected, rtol=1e-12, atol=1e-20)
    assert shrinkage == pytest.approx(expected_shrinkage, rel=1e-12, abs=1e-15)
    if n == t:  # a singular sample: the shrunk estimate is well conditioned
        assert np.linalg.matrix_rank(returns - returns.mean(1, keepdims=True)) < n
        assert np.linalg.eigvalsh(cov).min() > 0.05 * np.trace(cov) / n


def test_constant_returns_give_a_zero_estimate_and_the_floor_keeps_it_invertible() -> None:
    flat = np.zeros((4, 10))
    cov, shrinkage = ledoit_wolf(flat)
    np.testing.assert_array_equal(cov, np.zeros((4, 4)))
    assert shrinkage == 0.0
    np.testing.assert_array_equal(risk_covariance(flat), VOL_FLOOR**2 * np.eye(4))
    with pytest.raises(ValueError, match=r"\(N, T\)"):
        ledoit_wolf(np.zeros(5))


# ---------------------------------------------------------------------------------------------
# minimum variance


@pytest.mark.parametrize(("n", "t"), SHAPES)
def test_min_variance_is_skfolios_and_satisfies_kkt(n: int, t: int) -> None:
    returns = market_returns(n, t, seed=n * 7 + t)
    cov, _ = ledoit_wolf(returns)
    w = min_variance_weights(cov)
    assert_min_variance_kkt(cov, w)
    np.testing.assert_allclose(w, skfolio_min_variance(returns), rtol=0, atol=1e-6)


def test_min_variance_leaves_out_assets_and_matches_a_closed_form() -> None:
    # Two assets: w_1 = (s22 - s12) / (s11 + s22 - 2 s12) while that lies in [0, 1].
    cov = np.array([[4.0, 1.0], [1.0, 2.0]]) * 1e-4
    np.testing.assert_allclose(min_variance_weights(cov), [0.25, 0.75], rtol=1e-14)
    # Highly correlated with a calmer asset: the long-only optimum holds none of it.
    cov = np.array([[1.0, 0.9, 0.0], [0.9, 1.0, 0.0], [0.0, 0.0, 1.0]]) * np.outer(
        [1.0, 2.0, 1.0], [1.0, 2.0, 1.0]
    )
    w = min_variance_weights(cov)
    assert w[1] == 0.0
    assert w[0] > 0
    assert w[2] > 0
    assert_min_variance_kkt(cov, w)


@given(st.integers(1, 8), st.integers(1, 30), st.integers(0, 2**32 - 1))
def test_nnls_normal_is_optimal(n: int, t: int, seed: int) -> None:
    """KKT of min ||Av - b|| over v >= 0 from A'A and A'b: gradient 0 where v > 0, <= 0 else."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(max(n, t), n))
    b = rng.normal(size=max(n, t))
    gram, rhs = a.T @ a + 1e-9 * np.eye(n), a.T @ b
    v = nnls_normal(gram, rhs)
    gradient = rhs - gram @ v
    scale = np.abs(rhs).max() + np.abs(gram).max() * np.abs(v).sum()
    assert np.all(v >= 0.0)
    np.testing.assert_allclose(gradient[v > 0], 0.0, atol=1e-9 * scale)
    assert np.all(gradient[v == 0] <= 1e-9 * scale)


# ---------------------------------------------------------------------------------------------
# HRP


@pytest.mark.parametrize(("n", "t"), [s for s in SHAPES if s[0] > 1])
def test_single_linkage_order_is_scipys(n: int, t: int) -> None:
    d = correlation_distance(ledoit_wolf(market_returns(n, t, seed=n + t))[0])
    expected = leaves_list(linkage(squareform(d, checks=False), method="single"))
    np.testing.assert_array_equal(single_linkage_order(d), expected)


@pytest.mark.parametrize(("n", "t"), SHAPES)
def test_hrp_is_skfolios(n: int, t: int) -> None:
    returns = market_returns(n, t, seed=n * 3 + t)
    w = hrp_weights(ledoit_wolf(returns)[0])
    np.testing.assert_allclose(w, skfolio_hrp(returns), rtol=0, atol=1e-8)
    assert w.sum() == pytest.approx(1.0, abs=1e-12)


def test_hrp_of_uncorrelated_assets_splits_by_inverse_variance_halves() -> None:
    # Four uncorrelated assets, variances 1, 2, 3, 4: all distances tie, the tree chains them
    # in index order and its leaves come out as [3, 2, 0, 1]. Halves {3, 2} and {0, 1} have
    # inverse-variance portfolio variances 12/7 and 2/3; whichever is drawn left, each half gets
    # the other's share of the total, and a pair splits by inverse variance.
    cov = np.diag([1.0, 2.0, 3.0, 4.0])
    w = hrp_weights(cov)
    alpha = 1 - (2 / 3) / (2 / 3 + 12 / 7)
    expected = [alpha * 2 / 3, alpha / 3, (1 - alpha) * 4 / 7, (1 - alpha) * 3 / 7]
    np.testing.assert_allclose(w, expected, rtol=1e-14)


# ---------------------------------------------------------------------------------------------
# the anchors


@pytest.mark.parametrize("kind", RISK_KINDS)
def test_risk_anchor_is_the_reference_on_the_live_assets_with_its_cash_share(kind) -> None:
    returns = market_returns(9, WINDOW + 3, seed=5)
    prices = closes_of(returns)
    mask = np.array([True, True, False, True, True, True, False, True, True, True])
    prices[~mask[1:]] = np.nan
    spec = AnchorSpec(kind=kind, cash_share=0.1, vol_window=WINDOW)
    w = anchor_weights(prices, mask, spec)
    live = log_returns(prices[mask[1:], -(WINDOW + 1) :])
    order = np.lexsort(live.T[::-1])
    reference = skfolio_hrp if kind is AnchorKind.HRP else skfolio_min_variance
    expected = np.zeros(7)
    expected[order] = reference(live[order])
    assert w[0] == pytest.approx(0.1, abs=1e-15)
    np.testing.assert_array_equal(w[1:][~mask[1:]], 0.0)
    np.testing.assert_allclose(w[1:][mask[1:]] / 0.9, expected, rtol=0, atol=1e-6)
    assert w.sum() == pytest.approx(1.0, abs=1e-14)
    assert spec.prices_per_asset == WINDOW + 1


@settings(max_examples=60)
@given(universe(n_prices=WINDOW + 1, max_assets=8), st.sampled_from(RISK_KINDS), st.data())
def test_permuting_live_assets_permutes_a_risk_anchor_exactly(case, kind, data) -> None:
    """Duplicated closes (the strategy copies rows) included: equal rows get equal weights."""
    prices, mask = case
    spec = AnchorSpec(kind=kind, cash_share=0.05, vol_window=WINDOW)
    perm = data.draw(permutation(prices.shape[0]))
    w = anchor_weights(prices, mask, spec)
    moved = anchor_weights(prices[perm], np.concatenate([[True], mask[1:][perm]]), spec)
    np.testing.assert_array_equal(moved, np.concatenate([w[:1], w[1:][perm]]))
    assert np.all(np.isfinite(w))
    assert np.all(w >= 0)
    assert w.sum() == pytest.approx(1.0, abs=1e-12)


@settings(max_examples=30)
@given(universe(n_prices=WINDOW + 1, max_assets=8), st.sampled_from(RISK_KINDS))
def test_masked_rows_do_not_matter(case, kind) -> None:
    prices, mask = case
    spec = AnchorSpec(kind=kind, cash_share=0.2, vol_window=WINDOW)
    w = anchor_weights(prices, mask, spec)
    other = prices.copy()
    other[~mask[1:]] = 7.0  # finite closes where there was garbage
    np.testing.assert_array_equal(anchor_weights(other, mask, spec), w)
    live_only = anchor_weights(prices[mask[1:]], np.ones(int(mask.sum()), bool), spec)
    np.testing.assert_allclose(w[mask], live_only, rtol=1e-14, atol=0)
    assert np.all(w[~mask] == 0.0)


@pytest.mark.parametrize("kind", RISK_KINDS)
def test_degenerate_windows_give_a_distribution(kind) -> None:
    spec = AnchorSpec(kind=kind, cash_share=0.05, vol_window=WINDOW)
    one = anchor_weights(closes_of(market_returns(1, WINDOW, 1)), [1, 1], spec)
    np.testing.assert_array_equal(one, [0.05, 0.95])
    flat = anchor_weights(np.full((3, WINDOW + 1), 20.0), [1, 1, 1, 1], spec)
    np.testing.assert_allclose(flat, [0.05, 0.95 / 3, 0.95 / 3, 0.95 / 3], rtol=1e-15)
    # One flat asset among moving ones: shrinkage gives it the mean variance's share, so it is
    # not riskless, but it is the least risky one, and nothing is NaN.
    prices = closes_of(market_returns(3, WINDOW, 2))
    prices[1] = 20.0
    w = anchor_weights(prices, [1, 1, 1, 1], spec)
    assert np.all(np.isfinite(w))
    assert w[2] == w[1:].max()
    # A window of one return: a zero covariance after centering, so an equal split.
    short = AnchorSpec(kind=kind, cash_share=0.0, vol_window=1)
    np.testing.assert_allclose(anchor_weights(prices, [1, 1, 1, 1], short)[1:], 1 / 3, rtol=1e-15)


@pytest.mark.parametrize("kind", RISK_KINDS)
def test_equal_rows_share_their_weight_and_batches_equal_their_rows(kind) -> None:
    spec = AnchorSpec(kind=kind, cash_share=0.0, vol_window=WINDOW)
    prices = closes_of(market_returns(4, WINDOW, 3))
    prices[3] = prices[0] * 2.0  # same returns as asset 0
    w = anchor_weights(prices, np.ones(5, bool), spec)
    assert w[1] == w[4]
    rng = np.random.default_rng(4)
    batch = closes_of(market_returns(3 * 5, WINDOW + 2, 9)).reshape(3, 5, WINDOW + 3)
    masks = rng.random((3, 6)) < 0.7
    together = anchor_weights(batch, masks, spec)
    for b in range(3):
        np.testing.assert_array_equal(together[b], anchor_weights(batch[b], masks[b], spec))
