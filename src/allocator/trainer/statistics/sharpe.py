"""The excess Sharpe of a policy over a benchmark, with a stationary-bootstrap interval over
*paired* days (common market noise cancels) in blocks that keep the autocorrelation. Sharpe is
``performance``'s convention (ddof 1, sqrt(252), flat scores 0).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from arch.bootstrap import StationaryBootstrap, optimal_block_length
from numpy.typing import ArrayLike, NDArray

from allocator.trainer.sim.performance import PERIODS_PER_YEAR
from allocator.trainer.statistics.checks import FLAT, daily_returns, paired_returns, positive_int

IntervalMethod = Literal["percentile", "bca"]
INTERVAL_METHODS: tuple[str, ...] = ("percentile", "bca")


def sharpe_columns(
    returns: NDArray[np.float64], periods_per_year: int = PERIODS_PER_YEAR
) -> NDArray[np.float64]:
    """Annualized Sharpe of each ``(days, k)`` column, unchecked (the bootstrap's inner loop);
    flat scores 0, constant non-zero NaN."""
    mean = returns.mean(axis=0)
    std = returns.std(axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(std > 0, mean / std, np.where(mean == 0, 0.0, np.nan))
    return ratio * math.sqrt(periods_per_year)


def annualized_sharpe(returns: ArrayLike) -> float:
    """The annualized Sharpe ratio of daily net returns (at least two finite values)."""
    return float(sharpe_columns(daily_returns(returns, "returns", min_days=2)[:, None])[0])


def block_size(data: ArrayLike) -> int:
    """Stationary-bootstrap mean block of ``data`` (days, or days x series): the largest
    Politis-White estimate rounded up (the interval errs wide), 1 if every series is constant."""
    x = np.asarray(data, dtype=np.float64)
    x = x[:, None] if x.ndim == 1 else x
    varying = x[:, x.std(axis=0) > FLAT]
    if varying.shape[1] == 0:
        return 1
    with np.errstate(all="ignore"):
        estimates = optimal_block_length(varying)["stationary"].to_numpy(dtype=np.float64)
    finite = estimates[np.isfinite(estimates)]
    if finite.size == 0:
        return 1
    return int(min(max(1, math.ceil(float(finite.max()))), max(1, x.shape[0] // 2)))


@dataclass(frozen=True)
class ExcessSharpe:
    """The policy's annualized Sharpe minus the benchmark's on the same days, with an interval."""

    estimate: float
    low: float
    high: float
    level: float
    method: str
    policy_sharpe: float
    benchmark_sharpe: float
    days: int
    block_size: int
    reps: int
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def excess_sharpe_interval(
    policy: ArrayLike,
    benchmark: ArrayLike,
    *,
    level: float = 0.95,
    reps: int = 1000,
    block: int | None = None,
    seed: int = 0,
    method: IntervalMethod = "percentile",
) -> ExcessSharpe:
    """Excess annualized Sharpe of ``policy`` over ``benchmark`` (net returns of the same days)
    and its two-sided interval at ``level``; to pool windows, concatenate their days in order."""
    data = paired_returns(policy, benchmark, ("policy", "benchmark"))
    if method not in INTERVAL_METHODS:
        raise ValueError(f"method must be one of {INTERVAL_METHODS}, got {method!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie strictly between 0 and 1, got {level!r}")
    reps = positive_int(reps, "reps")
    mean_block = block_size(data) if block is None else positive_int(block, "block")
    sharpes = sharpe_columns(data)

    def excess(sample: NDArray[np.float64]) -> NDArray[np.float64]:
        s = sharpe_columns(sample)
        return np.array([s[0] - s[1]])

    def interval(how: IntervalMethod) -> tuple[float, float]:
        boot = StationaryBootstrap(mean_block, data, seed=int(seed))  # seeded afresh per call
        with np.errstate(all="ignore"):
            bounds = boot.conf_int(excess, reps=reps, method=how, size=level, tail="two")
        return float(bounds[0, 0]), float(bounds[1, 0])

    used = method
    try:
        low, high = interval(method)
    except RuntimeError:  # arch: BCa's bias correction saw no replicate on one side
        low = high = math.nan
    if not (math.isfinite(low) and math.isfinite(high)) and method == "bca":
        used = "percentile"  # BCa needs replicates on both sides of the estimate
        low, high = interval(used)
    return ExcessSharpe(
        estimate=float(sharpes[0] - sharpes[1]),
        low=low,
        high=high,
        level=float(level),
        method=used,
        policy_sharpe=float(sharpes[0]),
        benchmark_sharpe=float(sharpes[1]),
        days=int(data.shape[0]),
        block_size=mean_block,
        reps=reps,
        seed=int(seed),
    )
