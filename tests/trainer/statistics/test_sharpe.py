"""The excess Sharpe and its stationary-bootstrap interval, on series whose truth is known."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.typing import NDArray

from allocator.trainer.sim.performance import performance
from allocator.trainer.statistics.sharpe import (
    annualized_sharpe,
    block_size,
    excess_sharpe_interval,
)

DAYS = 1500
MARKET = (0.0003, 0.010)  # daily mean and volatility of the common part
EDGE = (0.0006, 0.003)  # the policy's extra daily return: mean and volatility


def edge_pair(seed: int, days: int = DAYS) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """A benchmark and a policy that earns it plus an independent positive edge."""
    rng = np.random.default_rng(seed)
    market = rng.normal(*MARKET, days)
    return market + rng.normal(*EDGE, days), market


def true_excess() -> float:
    """The population excess Sharpe of ``edge_pair``: (mu_m + mu_e) / sqrt(s_m^2 + s_e^2)
    minus mu_m / s_m, annualized."""
    (mu_m, s_m), (mu_e, s_e) = MARKET, EDGE
    policy = (mu_m + mu_e) / math.hypot(s_m, s_e)
    return (policy - mu_m / s_m) * math.sqrt(252)


def test_the_sharpe_is_the_backtests_sharpe() -> None:
    r = np.random.default_rng(3).normal(0.0004, 0.012, 300)
    flat = np.zeros(50)
    assert annualized_sharpe(r) == pytest.approx(performance(r, r * 0, r * 0)["sharpe"], rel=1e-12)
    assert annualized_sharpe(flat) == performance(flat, flat, flat)["sharpe"] == 0.0


def test_a_clear_edge_is_covered_and_told_from_zero() -> None:
    policy, market = edge_pair(seed=11)
    res = excess_sharpe_interval(policy, market, reps=1000, seed=0)
    assert res.low < true_excess() < res.high
    assert res.low > 0
    assert res.estimate == pytest.approx(annualized_sharpe(policy) - annualized_sharpe(market))
    assert res.low < res.estimate < res.high
    assert (res.method, res.reps, res.days, res.level) == ("percentile", 1000, DAYS, 0.95)
    bca = excess_sharpe_interval(policy, market, reps=1000, seed=0, method="bca")
    assert bca.method == "bca"
    assert bca.low < true_excess() < bca.high


def test_the_interval_covers_the_truth_about_as_often_as_it_claims() -> None:
    """40 independent series at 90%: coverage near 36 of 40 (below 30 has probability < 1%)."""
    true = true_excess()
    hits = 0
    for seed in range(40):
        policy, market = edge_pair(seed, days=500)
        res = excess_sharpe_interval(policy, market, level=0.90, reps=500, seed=seed)
        hits += res.low < true < res.high
    assert 30 <= hits <= 40


def test_identical_series_give_a_zero_interval() -> None:
    _, market = edge_pair(seed=5)
    for method in ("percentile", "bca"):
        res = excess_sharpe_interval(market, market, reps=500, seed=1, method=method)
        assert res.estimate == 0.0
        assert res.low <= 0.0 <= res.high
        assert res.method == "percentile"  # BCa has no replicate off the estimate


def test_the_same_seed_gives_the_same_interval() -> None:
    policy, market = edge_pair(seed=2, days=400)
    a = excess_sharpe_interval(policy, market, reps=500, seed=7)
    b = excess_sharpe_interval(policy, market, reps=500, seed=7)
    c = excess_sharpe_interval(policy, market, reps=500, seed=8)
    assert a == b
    assert (a.low, a.high) != (c.low, c.high)
    assert a.estimate == c.estimate


def test_the_block_grows_with_autocorrelation() -> None:
    rng = np.random.default_rng(0)
    noise = rng.normal(size=2000)
    persistent = np.empty_like(noise)
    persistent[0] = noise[0]
    for t in range(1, noise.size):
        persistent[t] = 0.9 * persistent[t - 1] + noise[t]
    assert block_size(persistent) > 5 * block_size(noise)
    assert block_size(np.zeros(100)) == 1
    assert block_size(np.column_stack([noise, persistent])) == block_size(persistent)
    fixed = excess_sharpe_interval(noise, persistent / 10, reps=200, block=12)
    assert fixed.block_size == 12


@pytest.mark.parametrize(
    ("policy", "benchmark", "kwargs", "message"),
    [
        (np.zeros(100), np.zeros(99), {}, "policy has 100 daily returns but benchmark has 99"),
        (np.r_[np.zeros(50), np.nan], np.zeros(51), {}, "policy has 1 non-finite value"),
        (np.zeros(60), np.r_[np.zeros(59), np.inf], {}, "benchmark has 1 non-finite"),
        (np.zeros(10), np.zeros(10), {}, "policy has 10 daily returns; at least 20"),
        (np.zeros((30, 2)), np.zeros(30), {}, "policy must be one-dimensional"),
        (np.zeros(30), np.zeros(30), {"level": 1.0}, "level must lie strictly between 0 and 1"),
        (np.zeros(30), np.zeros(30), {"reps": 0}, "reps must be an integer >= 1"),
        (np.zeros(30), np.zeros(30), {"block": 0}, "block must be an integer >= 1"),
        (np.zeros(30), np.zeros(30), {"method": "basic"}, "method must be one of"),
    ],
)
def test_bad_input_is_named(
    policy: NDArray[np.float64],
    benchmark: NDArray[np.float64],
    kwargs: dict[str, object],
    message: str,
) -> None:
    with pytest.raises(ValueError, match=message):
        excess_sharpe_interval(policy, benchmark, **kwargs)  # type: ignore[arg-type]
