"""The probabilistic and the deflated Sharpe ratio, against the paper's worked example."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from allocator.trainer.statistics.deflated import (
    deflated_sharpe_of_returns,
    expected_max_sharpe,
    probabilistic_sharpe,
)
from allocator.trainer.statistics.sharpe import annualized_sharpe


def test_the_papers_worked_example() -> None:
    """Bailey and Lopez de Prado (2014), "The Deflated Sharpe Ratio", numerical example: the
    best of N = 100 independent trials has an annualized Sharpe of 2.5 over T = 1250 daily
    observations (five years of 250 days), skewness -3 and kurtosis 10; the trials' Sharpes
    have an annualized variance of 1/2. The paper finds a threshold SR0 of about 0.1132 per
    day and DSR = 0.9004: the Sharpe is not significant at 95% once the 100 trials count."""
    days_per_year = 250
    sr = 2.5 / math.sqrt(days_per_year)
    variance = 0.5 / days_per_year
    assert expected_max_sharpe(100, variance) == pytest.approx(0.1132, abs=5e-5)
    dsr = probabilistic_sharpe(sr, expected_max_sharpe(100, variance), 1250, -3.0, 10.0)
    assert dsr == pytest.approx(0.9004, abs=5e-5)


def test_the_expected_maximum_is_that_of_simulated_trials() -> None:
    """The closed form against the mean maximum of N standard normals (within 2%)."""
    rng = np.random.default_rng(0)
    for n in (10, 100, 1000):
        simulated = rng.standard_normal((4000, n)).max(axis=1).mean()
        assert expected_max_sharpe(n, 1.0) == pytest.approx(simulated, rel=0.02)
    assert expected_max_sharpe(1, 4.0) == 0.0
    assert expected_max_sharpe(100, 4.0) == pytest.approx(2 * expected_max_sharpe(100, 1.0))


def test_one_trial_deflates_nothing_and_more_trials_deflate_more() -> None:
    sr, days = 0.08, 500
    psr = probabilistic_sharpe(sr, 0.0, days, -0.5, 5.0)
    assert probabilistic_sharpe(sr, expected_max_sharpe(1, 0.01), days, -0.5, 5.0) == psr
    trials = (1, 2, 10, 100, 1000)
    dsr = [probabilistic_sharpe(sr, expected_max_sharpe(n, 0.001), days, -0.5, 5.0) for n in trials]
    assert all(a > b for a, b in itertools.pairwise(dsr))
    # Normal returns: PSR(0) is the t-test of a zero mean, to first order.
    assert probabilistic_sharpe(sr, 0.0, days, 0.0, 3.0) == pytest.approx(
        stats.norm.cdf(sr * math.sqrt(days - 1) / math.sqrt(1 + sr**2 / 2))
    )
    # Negative skew and fat tails widen the Sharpe's error: less confidence.
    assert probabilistic_sharpe(sr, 0.0, days, -2.0, 9.0) < probabilistic_sharpe(
        sr, 0.0, days, 0.0, 3.0
    )


def test_of_returns_uses_their_moments() -> None:
    r = np.random.default_rng(1).standard_t(4, 750) * 0.01 + 0.0006
    res = deflated_sharpe_of_returns(r, trials=20, trials_sharpe_variance=0.8)
    sr = res.sharpe / math.sqrt(252)
    skew, kurt = stats.skew(r), stats.kurtosis(r, fisher=False)
    assert res.sharpe == pytest.approx(annualized_sharpe(r))
    assert (res.skew, res.kurtosis) == pytest.approx((skew, kurt))
    sr0 = expected_max_sharpe(20, 0.8 / 252)
    assert res.deflated == pytest.approx(probabilistic_sharpe(sr, sr0, 750, skew, kurt))
    assert res.probabilistic == pytest.approx(probabilistic_sharpe(sr, 0.0, 750, skew, kurt))
    assert res.expected_max_sharpe == pytest.approx(
        expected_max_sharpe(20, 0.8 / 252) * math.sqrt(252)
    )
    assert res.deflated < res.probabilistic
    default = deflated_sharpe_of_returns(r, trials=20)
    assert default.trials_sharpe_variance == 252 / 749


def test_a_flat_series_is_a_coin_flip() -> None:
    res = deflated_sharpe_of_returns(np.zeros(100))
    assert (res.sharpe, res.probabilistic, res.deflated) == (0.0, 0.5, 0.5)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: expected_max_sharpe(0, 1.0), "trials must be an integer >= 1"),
        (lambda: expected_max_sharpe(10, -1.0), "variance must be >= 0"),
        (lambda: probabilistic_sharpe(float("nan"), 0, 100, 0, 3), "sharpe must be finite"),
        (lambda: probabilistic_sharpe(0.1, 0, 1, 0, 3), "days must be at least 2"),
        (lambda: probabilistic_sharpe(1.0, 0, 100, 5.0, 1.0), "variance is undefined"),
        (lambda: deflated_sharpe_of_returns(np.r_[np.zeros(30), np.nan]), "1 non-finite"),
        (lambda: deflated_sharpe_of_returns(np.zeros(5)), "at least 20"),
        (lambda: deflated_sharpe_of_returns(np.full(30, 0.01)), "constant and non-zero"),
        (
            lambda: deflated_sharpe_of_returns(np.zeros(30), trials_sharpe_variance=-1),
            "trials_sharpe_variance must be >= 0",
        ),
    ],
)
def test_bad_input_is_named(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]
