"""The cost model (``cost_bps`` basis points of traded value) of the environment and the paper
broker: one function for both, so a paper account's costs are the backtest's, not a copy."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

MAX_COST_BPS = 5_000.0
"""Turnover is at most 2 (sell everything, buy everything): costs stay below NAV."""


def cost_rate(cost_bps: float) -> float:
    """The fraction of traded value a trade costs; ``cost_bps`` must lie in [0, MAX_COST_BPS)."""
    if not 0.0 <= cost_bps < MAX_COST_BPS:
        raise ValueError(f"cost_bps must lie in [0, {MAX_COST_BPS:g}), got {cost_bps}")
    return cost_bps / 1e4


def turnover(new: NDArray[np.float64], held: NDArray[np.float64]) -> Any:
    """``sum |new - held|`` over the assets (cash first, last axis): the fraction of NAV traded."""
    return np.add.reduce(np.abs(new[..., 1:] - held[..., 1:]), axis=-1)


def trade_cost(rate: float, traded: float, scale: float = 1.0) -> float:
    """``rate * traded * scale`` (turnover and NAV, or a fill's value), in the env's order."""
    return rate * traded * scale
