"""Generated markets whose right answer is known, for learning tests.

The generators live in ``allocator.trainer.market.generated`` (the market suite uses them too);
they are re-exported here so the tests keep one place to import markets from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from allocator.trainer.market.data import MarketData, from_wide, load_dataset
from allocator.trainer.market.generated import drift_market, rotating_market, rotating_schedule

__all__ = [
    "drift_market",
    "random_walk_market",
    "rotating_market",
    "rotating_schedule",
    "tiny_model_options",
    "to_long_frame",
    "write_market",
    "write_sp500_slice",
]


def to_long_frame(data: MarketData) -> pd.DataFrame:
    """Long-format frame (date, asset, close) of ``data``; the inverse of loading."""
    frame = data.to_frame()
    frame.index.name = "date"
    long = frame.reset_index().melt(id_vars="date", var_name="asset", value_name="close")
    return long.dropna(subset=["close"]).sort_values(["date", "asset"]).reset_index(drop=True)


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
