"""Generated markets whose right answer is known, for learning tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from allocator.trainer.market.data import MarketData, from_wide, to_long_frame


def drift_market(
    n_days: int = 1500, n_flat: int = 3, drift: float = 0.003, vol: float = 0.006, seed: int = 0
) -> pd.DataFrame:
    """One asset (``UP``) with a clear positive drift among drift-less ones of equal volatility."""
    rng = np.random.default_rng(seed)
    dates = pd.bdate_range("2000-01-03", periods=n_days)
    mus = np.array([drift] + [0.0] * n_flat)
    returns = rng.normal(mus, vol, size=(n_days, mus.size))
    names = ["UP"] + [f"FLAT{i}" for i in range(n_flat)]
    return pd.DataFrame(100.0 * np.exp(np.cumsum(returns, axis=0)), index=dates, columns=names)


def rotating_market(
    n_days: int = 1500,
    n_assets: int = 4,
    period: int = 20,
    drift: float = 0.004,
    vol: float = 0.006,
    seed: int = 0,
) -> pd.DataFrame:
    """The trending asset changes every ``period`` days (in a random order).

    The others drift down by as much in total, so holding everything earns nothing: only
    following the rotation pays, and only if it is not eaten by costs.
    """
    rng = np.random.default_rng(seed)
    dates = pd.bdate_range("2000-01-03", periods=n_days)
    leader = np.repeat(rng.integers(0, n_assets, size=n_days // period + 1), period)[:n_days]
    mus = np.full((n_days, n_assets), -drift / (n_assets - 1))
    mus[np.arange(n_days), leader] = drift
    returns = mus + rng.normal(0.0, vol, size=(n_days, n_assets))
    names = [f"R{i}" for i in range(n_assets)]
    return pd.DataFrame(100.0 * np.exp(np.cumsum(returns, axis=0)), index=dates, columns=names)


def write_market(frame: pd.DataFrame, path: Path) -> Path:
    """Save a generated market as the long-format CSV users bring."""
    to_long_frame(from_wide(frame, "generated")).to_csv(path, index=False)
    return path


def random_walk_market(n_dates: int = 300, n_assets: int = 3, seed: int = 0) -> MarketData:
    """Seeded geometric random walks on business days: a small market for fast model tests."""
    rng = np.random.default_rng(seed)
    steps = rng.normal(0.0003, 0.015, size=(n_dates, n_assets))
    prices = 20.0 * rng.uniform(1, 5, n_assets) * np.exp(np.cumsum(steps, axis=0))
    dates = pd.bdate_range("2019-01-01", periods=n_dates)
    frame = pd.DataFrame(prices, index=dates, columns=[f"A{j}" for j in range(n_assets)])
    return from_wide(frame, source="synthetic")


def tiny_model_options(seed: int = 0, batch_size: int = 32, **overrides: Any) -> dict[str, Any]:
    """SB3 keyword arguments for a model small enough to train in milliseconds."""
    options: dict[str, Any] = {
        "policy_kwargs": {"net_arch": [16, 16]},
        "batch_size": batch_size,
        "buffer_size": 1000,
        "learning_starts": 50,
        "seed": seed,
        "device": "cpu",
        "verbose": 0,
    }
    options.update(overrides)
    return options
