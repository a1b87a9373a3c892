"""The probabilistic and the deflated Sharpe ratio (Bailey and Lopez de Prado, JPM 40(5), 2014):
short samples and fat tails widen a Sharpe's error, and the best of N configurations is
inflated by luck. With per-period (daily) SR over T periods, skewness g3, plain kurtosis g4:

- PSR(SR*) = Z[(SR - SR*) sqrt(T - 1) / sqrt(1 - g3 SR + (g4 - 1) / 4 SR^2)];
- SR0 = sqrt(V) ((1 - gamma) Z^-1[1 - 1/N] + gamma Z^-1[1 - 1/(N e)]), the expected best of N
  zero-skill Sharpes of variance V (gamma: Euler-Mascheroni; N = 1: SR0 = 0);
- DSR = PSR(SR0).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from allocator.trainer.sim.performance import PERIODS_PER_YEAR
from allocator.trainer.statistics.checks import FLAT, daily_returns, positive_int
from allocator.trainer.statistics.sharpe import sharpe_columns


def _finite(value: float, name: str) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def probabilistic_sharpe(
    sharpe: float, benchmark: float, days: int, skew: float, kurtosis: float
) -> float:
    """PSR: the probability that the true per-period Sharpe exceeds ``benchmark`` (g4 plain)."""
    sr = _finite(sharpe, "sharpe")
    if positive_int(days, "days") < 2:
        raise ValueError(f"days must be at least 2, got {days}")
    g3, g4 = _finite(skew, "skew"), _finite(kurtosis, "kurtosis")
    spread = 1.0 - g3 * sr + (g4 - 1.0) / 4.0 * sr**2
    if spread <= 0:
        raise ValueError(
            f"1 - skew*SR + (kurtosis-1)/4*SR^2 = {spread:.4g} <= 0 for SR {sr:.4g}, skew {g3:.4g}"
            f", kurtosis {g4:.4g}: the Sharpe ratio's variance is undefined"
        )
    z = (sr - _finite(benchmark, "benchmark")) * math.sqrt(days - 1) / math.sqrt(spread)
    return float(stats.norm.cdf(z))


def expected_max_sharpe(trials: int, variance: float) -> float:
    """SR0: the expected best of ``trials`` zero-skill Sharpes of per-period ``variance``."""
    n = positive_int(trials, "trials")
    v = _finite(variance, "variance")
    if v < 0:
        raise ValueError(f"variance must be >= 0, got {v!r}")
    if n == 1:
        return 0.0
    gamma = float(np.euler_gamma)
    z = (1.0 - gamma) * stats.norm.ppf(1.0 - 1.0 / n) + gamma * stats.norm.ppf(
        1.0 - 1.0 / (n * math.e)
    )
    return float(math.sqrt(v) * z)


@dataclass(frozen=True)
class DeflatedSharpe:
    """A return series' Sharpe (annualized), its PSR against 0 and its DSR, with the inputs."""

    sharpe: float
    probabilistic: float
    deflated: float
    expected_max_sharpe: float
    trials: int
    trials_sharpe_variance: float
    skew: float
    kurtosis: float
    days: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def deflated_sharpe_of_returns(
    returns: ArrayLike, trials: int = 1, trials_sharpe_variance: float | None = None
) -> DeflatedSharpe:
    """PSR (against 0) and DSR of daily net returns: ``trials`` configurations tried, their
    Sharpes' annualized variance (None: ``252 / (days - 1)``, a zero-skill estimate's, a floor
    when their spread was not recorded); a flat series is normal."""
    x = daily_returns(returns, "returns")
    n = positive_int(trials, "trials")
    if trials_sharpe_variance is None:
        annual_variance = PERIODS_PER_YEAR / (x.size - 1)
    else:
        annual_variance = _finite(trials_sharpe_variance, "trials_sharpe_variance")
        if annual_variance < 0:
            raise ValueError(f"trials_sharpe_variance must be >= 0, got {annual_variance!r}")
    if x.std() > FLAT:
        sr = float(sharpe_columns(x[:, None], 1)[0])
        skew, kurt = float(stats.skew(x)), float(stats.kurtosis(x, fisher=False))
    elif abs(x.mean()) > FLAT:
        raise ValueError("returns are constant and non-zero: their Sharpe ratio is undefined")
    else:
        sr, skew, kurt = 0.0, 0.0, 3.0
    sr0 = expected_max_sharpe(n, annual_variance / PERIODS_PER_YEAR)
    scale = math.sqrt(PERIODS_PER_YEAR)
    return DeflatedSharpe(
        sharpe=sr * scale,
        probabilistic=probabilistic_sharpe(sr, 0.0, x.size, skew, kurt),
        deflated=probabilistic_sharpe(sr, sr0, x.size, skew, kurt),
        expected_max_sharpe=sr0 * scale,
        trials=n,
        trials_sharpe_variance=annual_variance,
        skew=skew,
        kurtosis=kurt,
        days=int(x.size),
    )
