"""Hansen's SPA of a policy against baselines, on policies better or worse by construction."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from allocator.trainer.statistics.spa import (
    NO_EVIDENCE,
    SpaPValues,
    policy_superiority,
    spa_pvalues,
)

DAYS = 750


def market(seed: int = 0) -> NDArray[np.float64]:
    return np.random.default_rng(seed).normal(0.0003, 0.01, DAYS)


def baselines(m: NDArray[np.float64], seed: int = 1) -> dict[str, NDArray[np.float64]]:
    """Three baselines that track the market with their own noise."""
    rng = np.random.default_rng(seed)
    return {
        "equal-weight": m,
        "min-variance": 0.6 * m + rng.normal(0.0001, 0.002, DAYS),
        "hrp": 0.8 * m + rng.normal(0.0, 0.002, DAYS),
    }


def ordered(p: SpaPValues) -> bool:
    return 0.0 <= p.lower <= p.consistent <= p.upper <= 1.0


def test_a_policy_that_dominates_every_baseline_gets_a_small_p_value() -> None:
    m = market()
    policy = m + np.random.default_rng(9).normal(0.001, 0.002, DAYS)
    res = policy_superiority(policy, baselines(m), reps=1000, seed=0)
    assert res.pvalues.consistent < 0.01
    assert all(p.consistent < 0.01 for p in res.per_baseline.values())
    assert ordered(res.pvalues)
    assert res.baselines_beat_policy.consistent > 0.5  # and no baseline beats it
    assert res.days == DAYS


def test_a_policy_worse_than_the_baselines_gets_a_large_p_value() -> None:
    """About 0.5, not 1: arch compares the recentred bootstrap means with the observed one
    without flooring it at zero, so a hopeless model lands in the middle of its draws."""
    m = market()
    policy = m + np.random.default_rng(9).normal(-0.001, 0.002, DAYS)
    res = policy_superiority(policy, baselines(m), reps=1000, seed=0)
    assert res.pvalues.consistent > 0.4
    assert all(p.consistent > 0.4 for p in res.per_baseline.values())
    assert res.baselines_beat_policy.consistent < 0.01
    assert ordered(res.baselines_beat_policy)


def test_beating_some_baselines_is_not_beating_all() -> None:
    """The intersection-union p-value is the largest one: the hardest baseline binds."""
    m = market()
    rng = np.random.default_rng(4)
    others = {"weak": m - 0.002 + rng.normal(0, 0.002, DAYS), "strong": m + 0.001}
    policy = m + rng.normal(0.0, 0.002, DAYS)
    res = policy_superiority(policy, others, reps=1000, seed=0)
    assert res.per_baseline["weak"].consistent < 0.01
    assert res.per_baseline["strong"].consistent > 0.4
    assert res.binding == "strong"
    assert res.pvalues.consistent == res.per_baseline["strong"].consistent


def test_identical_and_constant_differentials_are_decided_without_a_bootstrap() -> None:
    m = market()
    assert spa_pvalues(-m, -m) == NO_EVIDENCE
    assert spa_pvalues(-m, -(m + 0.001)).consistent == 0.0  # better by 10 bp every day
    assert spa_pvalues(-m, -(m - 0.001)) == NO_EVIDENCE
    res = policy_superiority(m, {"same": m, "other": baselines(m)["hrp"]}, reps=500)
    assert res.per_baseline["same"] == NO_EVIDENCE
    assert res.pvalues == NO_EVIDENCE


def test_the_same_seed_gives_the_same_p_values() -> None:
    m = market()
    policy = m + np.random.default_rng(2).normal(0.0002, 0.003, DAYS)
    a = policy_superiority(policy, baselines(m), reps=500, seed=3)
    b = policy_superiority(policy, baselines(m), reps=500, seed=3)
    assert a == b
    assert a.to_dict()["pvalues"] == {
        "lower": a.pvalues.lower,
        "consistent": a.pvalues.consistent,
        "upper": a.pvalues.upper,
    }


@pytest.mark.parametrize(
    ("policy", "others", "message"),
    [
        (np.zeros(100), {}, "baselines is empty"),
        (np.zeros(100), {"hrp": np.zeros(90)}, "baseline 'hrp' has 90 daily returns but"),
        (np.r_[np.zeros(99), np.nan], {"hrp": np.zeros(100)}, "policy has 1 non-finite"),
        (np.zeros(100), {"hrp": np.r_[np.nan, np.zeros(99)]}, "baseline 'hrp' has 1 non-finite"),
        (np.zeros(5), {"hrp": np.zeros(5)}, "policy has 5 daily returns; at least 20"),
    ],
)
def test_bad_input_is_named(
    policy: NDArray[np.float64], others: dict[str, NDArray[np.float64]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        policy_superiority(policy, others)


def test_model_losses_must_have_one_row_per_day() -> None:
    with pytest.raises(ValueError, match=r"model_losses has shape \(30, 2\); it needs 40 days"):
        spa_pvalues(np.zeros(40), np.zeros((30, 2)))
