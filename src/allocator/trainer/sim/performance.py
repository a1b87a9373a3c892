"""Performance figures from skfolio's measures: daily net returns, 252 days a year, zero
risk-free rate, ddof 1; Calmar is the annual return over the compounded max drawdown."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from skfolio import measures

PERIODS_PER_YEAR = 252
METRIC_KEYS = (
    "total_return",
    "annual_return",
    "annual_volatility",
    "sharpe",
    "sortino",
    "max_drawdown",
    "calmar",
    "turnover",
    "costs",
    "days",
)


def _ratio(num: float, den: float) -> float:
    """``num / den``; a riskless flat series scores 0, an undefined ratio NaN."""
    if den > 0:
        return num / den
    return 0.0 if num == 0 else float("nan")


def performance(
    returns: ArrayLike, turnover: ArrayLike, costs: ArrayLike, initial_value: float = 1.0
) -> dict[str, float]:
    """All metrics of one run from its daily net returns, turnover and costs (in currency)."""
    r = np.asarray(returns, dtype=np.float64)
    if r.size < 2:
        raise ValueError("need at least two daily returns for performance metrics")
    total = float(np.prod(1.0 + r) - 1.0)
    annual = float((1.0 + total) ** (PERIODS_PER_YEAR / r.size) - 1.0) if total > -1 else -1.0
    std = float(measures.standard_deviation(r))
    semi = float(measures.semi_deviation(r, min_acceptable_return=0.0))
    mdd = float(measures.max_drawdown(measures.get_drawdowns(r, compounded=True)))
    scale = math.sqrt(PERIODS_PER_YEAR)
    return {
        "total_return": total,
        "annual_return": annual,
        "annual_volatility": std * scale,
        "sharpe": _ratio(float(measures.mean(r)), std) * scale,
        "sortino": _ratio(float(measures.mean(r)), semi) * scale,
        "max_drawdown": abs(mdd),
        "calmar": _ratio(annual, mdd),
        "turnover": float(np.mean(np.asarray(turnover, dtype=np.float64))),
        "costs": float(np.sum(np.asarray(costs, dtype=np.float64))) / initial_value,
        "days": float(r.size),
    }


_SHORT = {
    "total_return": "total_ret",
    "annual_return": "ann_ret",
    "annual_volatility": "ann_vol",
    "max_drawdown": "max_dd",
}


def format_table(rows: Mapping[str, Mapping[str, float]]) -> str:
    """A fixed-width text table of metrics, one row per policy."""
    cols = [k for k in METRIC_KEYS if k != "days"]
    width = max(12, *(len(n) + 2 for n in rows)) if rows else 12
    head = f"{'policy':<{width}}" + "".join(f"{_SHORT.get(c, c):>10}" for c in cols)
    lines = [head, "-" * len(head)]
    for name, m in rows.items():
        lines.append(f"{name:<{width}}" + "".join(f"{m[c]:>10.4f}" for c in cols))
    return "\n".join(lines)


def format_allocation(summary: Mapping[str, Any]) -> str:
    """The allocation summary of a backtest as text: turnover, then each holding's range."""
    weights = summary["weights"]
    width = max(8, *(len(n) + 2 for n in weights)) if weights else 8
    lines = [
        f"mean daily turnover {summary['mean_daily_turnover']:.4f} "
        f"(median {summary['median_daily_turnover']:.4f}); executed weights per holding:",
        f"{'holding':<{width}}{'min':>8}{'mean':>8}{'max':>8}",
    ]
    for name, w in weights.items():
        lines.append(f"{name:<{width}}{w['min']:>8.3f}{w['mean']:>8.3f}{w['max']:>8.3f}")
    return "\n".join(lines)
