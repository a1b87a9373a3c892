"""Generated markets whose right answer is known, for learning tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from allocator.trainer.market.data import MarketData, from_wide, load_dataset, to_long_frame


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


def _leaders(rng: np.random.Generator, n_days: int, n_assets: int, period: int) -> np.ndarray:
    """The leading asset's column per day: a random draw every ``period`` days (repeats allowed).

    The first thing a market's generator draws, so ``rotating_schedule`` can replay it."""
    return np.repeat(rng.integers(0, n_assets, size=n_days // period + 1), period)[:n_days]


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
    following the rotation pays, and only if it is not eaten by costs. The leader of day t
    drives the return from close t - 1 to close t (``rotating_schedule`` gives it per day).
    """
    rng = np.random.default_rng(seed)
    dates = pd.bdate_range("2000-01-03", periods=n_days)
    leader = _leaders(rng, n_days, n_assets, period)
    mus = np.full((n_days, n_assets), -drift / (n_assets - 1))
    mus[np.arange(n_days), leader] = drift
    returns = mus + rng.normal(0.0, vol, size=(n_days, n_assets))
    names = [f"R{i}" for i in range(n_assets)]
    return pd.DataFrame(100.0 * np.exp(np.cumsum(returns, axis=0)), index=dates, columns=names)


def rotating_schedule(
    n_days: int = 1500, n_assets: int = 4, period: int = 20, seed: int = 0
) -> pd.Series:
    """The leader of ``rotating_market`` with the same arguments: its asset name per date.

    The value on date t names the asset whose drift drives the return realised at close t.
    """
    leader = _leaders(np.random.default_rng(seed), n_days, n_assets, period)
    dates = pd.bdate_range("2000-01-03", periods=n_days)
    return pd.Series([f"R{i}" for i in leader], index=dates, name="leader")


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


def write_sp500_slice(
    path: Path, assets: list[str], train_end: str, *, garbage_after_training: bool
) -> Path:
    """Some real stocks 2009-2014 as a price file; optionally random prices after ``train_end``.

    Anything that must not look past the training span (checkpoint selection, tuning) gives
    the same answer on both files: the poisoned one proves it never read a later price.
    """
    data = load_dataset("sp500").select(assets).between("2009-06-01", "2014-12-31")
    prices = data.prices.copy()
    if garbage_after_training:
        later = data.dates > pd.Timestamp(train_end)
        prices[later] = np.random.default_rng(7).uniform(0.01, 1_000.0, prices[later].shape)
    to_long_frame(MarketData(prices, data.dates, data.assets, "test")).to_csv(path, index=False)
    return path
