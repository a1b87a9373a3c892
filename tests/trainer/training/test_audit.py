"""The run audits: action saturation on hand-built paths and the state scale summary,
recomputed independently with numpy on a synthetic random walk.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from allocator.portfolio import fit_normalization
from allocator.trainer.training.audit import action_saturation, state_scale_summary

# --- action_saturation ----------------------------------------------------------------------


def test_action_saturation_counts_bound_hits_repeats_and_gate_by_hand() -> None:
    actions = [
        [1.0, 0.0],
        [0.96, -0.5],
        [0.96, -0.5],  # repeats the previous action
        [-0.95, 0.2],  # exactly on the near-bound threshold counts as near
        [-0.95, 0.2 + 1e-7],  # within equal_tol of the previous one
    ]
    out = action_saturation(actions)
    assert out["steps"] == 5
    assert out["near_bound_threshold"] == 0.95
    # Dimension 0 is near a bound on all 5 steps, dimension 1 never: 5 of 10 entries.
    assert out["near_bound_ratio"] == pytest.approx(0.5)
    assert out["near_bound_ratio_per_dim"] == pytest.approx([1.0, 0.0])
    # Of 4 consecutive pairs, (2, 3) and (4, 5) are equal.
    assert out["action_equal_ratio"] == pytest.approx(0.5)
    kappa0 = [0.0, 1 - 0.96**2, 1 - 0.96**2, 1 - 0.95**2, 1 - 0.95**2]
    kappa1 = [1.0, 0.75, 0.75, 0.96, 1 - (0.2 + 1e-7) ** 2]
    assert out["mean_kappa_per_dim"] == pytest.approx([sum(kappa0) / 5, sum(kappa1) / 5], abs=1e-6)
    assert out["mean_kappa"] == pytest.approx((sum(kappa0) + sum(kappa1)) / 10, rel=1e-12)
    json.dumps(out)  # written to action_saturation.json


def test_fully_saturated_constant_policy_has_zero_gate_and_only_repeats() -> None:
    out = action_saturation(np.tile([1.0, -1.0, 1.0], (10, 1)))
    assert out["near_bound_ratio"] == 1.0
    assert out["action_equal_ratio"] == 1.0
    assert out["mean_kappa"] == 0.0


def test_centered_changing_policy_is_not_saturated() -> None:
    actions = np.column_stack([np.linspace(-0.5, 0.5, 11), np.linspace(0.3, -0.3, 11)])
    out = action_saturation(actions)
    assert out["near_bound_ratio"] == 0.0
    assert out["action_equal_ratio"] == 0.0
    expected = np.mean(1 - np.linspace(-0.5, 0.5, 11) ** 2) + np.mean(
        1 - np.linspace(0.3, -0.3, 11) ** 2
    )
    assert out["mean_kappa"] == pytest.approx(expected / 2)


def test_action_saturation_threshold_and_tolerance_are_parameters() -> None:
    actions = [[0.9, 0.0], [0.9, 0.01]]
    loose = action_saturation(actions, near_bound=0.85, equal_tol=0.05)
    strict = action_saturation(actions)
    assert loose["near_bound_ratio"] == 0.5
    assert loose["action_equal_ratio"] == 1.0
    assert strict["near_bound_ratio"] == 0.0
    assert strict["action_equal_ratio"] == 0.0


@pytest.mark.parametrize(
    "actions",
    [np.zeros(5), np.zeros((1, 3)), np.zeros((0, 3)), np.zeros((4, 2, 2))],
    ids=["1d", "one-step", "empty", "3d"],
)
def test_action_saturation_rejects_bad_shapes(actions: np.ndarray) -> None:
    with pytest.raises(ValueError, match="steps >= 2"):
        action_saturation(actions)


# --- state_scale_summary --------------------------------------------------------------------


def random_walk(n_dates: int = 400, n_assets: int = 3, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    steps = rng.normal(0.0003, 0.015, size=(n_dates, n_assets))
    prices = 30.0 * np.exp(np.cumsum(steps, axis=0))
    prices[:50, 2] = np.nan  # one asset listed late
    return prices


def abs_q(x: np.ndarray) -> dict[str, float]:
    a = np.abs(x)
    return {
        "p95_abs": float(np.quantile(a, 0.95)),
        "p99_abs": float(np.quantile(a, 0.99)),
        "max_abs": float(a.max()),
    }


@pytest.fixture(scope="module")
def prices() -> np.ndarray:
    return random_walk()


@pytest.fixture(scope="module")
def weights() -> np.ndarray:
    return np.random.default_rng(1).dirichlet(np.ones(4), size=100)


def test_state_scale_summary_quantiles_before_and_after_normalization(
    prices: np.ndarray, weights: np.ndarray
) -> None:
    stats = fit_normalization(prices)
    clip = 10.0
    out = state_scale_summary(prices, stats, clip, weights)
    r = np.log(prices[1:] / prices[:-1])
    r = r[np.isfinite(r)]
    assert r.size == 399 * 3 - 50  # the NaN-adjacent returns are dropped
    z = np.clip((r - r.mean()) / r.std(), -clip, clip)
    lr = out["features"]["log_return"]
    for key, value in abs_q(r).items():
        assert lr["pre_stats"][key] == pytest.approx(value, rel=1e-12)
    for key, value in abs_q(z).items():
        assert lr["post_stats"][key] == pytest.approx(value, rel=1e-5)  # float32 features
    w = out["features"]["weights"]
    assert w["pre_stats"] == w["post_stats"]
    for key, value in abs_q(weights).items():
        assert w["pre_stats"][key] == pytest.approx(value, rel=1e-12)
    assert out["features"]["mask"]["pre_stats"] == pytest.approx(
        {"p95_abs": 0.95, "p99_abs": 0.99, "max_abs": 1.0}
    )
    assert out["normalization"] == pytest.approx({"mean": r.mean(), "std": r.std(), "clip": 10.0})
    json.dumps(out)  # written to state_scale_summary.json


def test_normalized_returns_are_order_one_while_raw_returns_are_order_one_percent(
    prices: np.ndarray, weights: np.ndarray
) -> None:
    out = state_scale_summary(prices, fit_normalization(prices), 10.0, weights)
    lr = out["features"]["log_return"]
    assert 0.01 < lr["pre_stats"]["p99_abs"] < 0.1  # daily sigma 1.5%: p99 ~ 2.6 sigma
    assert 1.0 < lr["post_stats"]["p99_abs"] < 5.0
    assert lr["post_stats"]["p99_abs"] / lr["pre_stats"]["p99_abs"] == pytest.approx(
        1 / 0.015, rel=0.1
    )


def test_scale_ratios_are_max_over_min_p99_across_features(
    prices: np.ndarray, weights: np.ndarray
) -> None:
    out = state_scale_summary(prices, fit_normalization(prices), 10.0, weights)
    f = out["features"]
    pre = [f[k]["pre_stats"]["p99_abs"] for k in ("log_return", "weights", "mask")]
    post = [f[k]["post_stats"]["p99_abs"] for k in ("log_return", "weights", "mask")]
    assert out["p99_scale_ratio_pre"] == pytest.approx(max(pre) / min(pre))
    assert out["p99_scale_ratio_post"] == pytest.approx(max(post) / min(post))
    # Normalization brings the returns to the weights' scale: the spread shrinks.
    assert out["p99_scale_ratio_pre"] > 10
    assert out["p99_scale_ratio_post"] < out["p99_scale_ratio_pre"]


def test_scale_ratio_ignores_features_with_zero_p99(prices: np.ndarray) -> None:
    # All-zero weights have p99 0: they are left out of the spread instead of dividing by 0.
    out = state_scale_summary(prices, fit_normalization(prices), 10.0, np.zeros((5, 4)))
    lr_pre = out["features"]["log_return"]["pre_stats"]["p99_abs"]
    assert out["p99_scale_ratio_pre"] == pytest.approx(0.99 / lr_pre)
    assert np.isfinite(out["p99_scale_ratio_post"])


def test_clip_bounds_the_normalized_returns(prices: np.ndarray, weights: np.ndarray) -> None:
    out = state_scale_summary(prices, fit_normalization(prices), 0.5, weights)
    post = out["features"]["log_return"]["post_stats"]
    assert post["max_abs"] == pytest.approx(0.5)
    assert post["p99_abs"] == pytest.approx(0.5)
    assert out["normalization"]["clip"] == 0.5
