"""Generated markets whose right answer is known: pure functions of their parameters and
``seed`` (the draw number) returning a wide price frame; ``GeneratedMarket`` fixes one kind's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

FIRST_DAY = "2000-01-03"
GENERATED_PREFIX = "generated:"


def _prices(returns: np.ndarray, names: list[str], start: str = FIRST_DAY) -> pd.DataFrame:
    dates = pd.bdate_range(start, periods=returns.shape[0])
    return pd.DataFrame(100.0 * np.exp(np.cumsum(returns, axis=0)), index=dates, columns=names)


def drift_market(
    n_days: int = 1500, n_flat: int = 3, drift: float = 0.003, vol: float = 0.006, seed: int = 0
) -> pd.DataFrame:
    """One asset (``UP``) with a clear positive drift among drift-less ones of equal volatility."""
    rng = np.random.default_rng(seed)
    mus = np.array([drift] + [0.0] * n_flat)
    returns = rng.normal(mus, vol, size=(n_days, mus.size))
    return _prices(returns, ["UP"] + [f"FLAT{i}" for i in range(n_flat)])


def _leaders(
    rng: np.random.Generator, n_days: int, n_states: int, period: float, irregular: bool = True
) -> np.ndarray:
    """The leader per day, drawn first from the stream (so a schedule replays it): redrawn every
    ``period`` days, or (``irregular``) with probability ``1 / period`` per close."""
    if not irregular:
        every = int(period)
        return np.repeat(rng.integers(0, n_states, size=n_days // every + 1), every)[:n_days]
    redraw = rng.random(n_days) < 1.0 / period
    redraw[0] = True
    draws = rng.integers(0, n_states, size=n_days)
    return draws[np.maximum.accumulate(np.where(redraw, np.arange(n_days), 0))]


def rotating_market(
    n_days: int = 1500,
    n_assets: int = 4,
    period: int = 20,
    drift: float = 0.004,
    vol: float = 0.006,
    seed: int = 0,
    irregular: bool = False,
) -> pd.DataFrame:
    """The trending asset changes (see ``_leaders``); the others drift down by as much in total,
    so only following the rotation pays."""
    rng = np.random.default_rng(seed)
    leader = _leaders(rng, n_days, n_assets, period, irregular)
    mus = np.full((n_days, n_assets), -drift / (n_assets - 1))
    mus[np.arange(n_days), leader] = drift
    returns = mus + rng.normal(0.0, vol, size=(n_days, n_assets))
    return _prices(returns, [f"R{i}" for i in range(n_assets)])


def rotating_schedule(
    n_days: int = 1500, n_assets: int = 4, period: int = 20, seed: int = 0, irregular: bool = False
) -> pd.Series:
    """The leader of ``rotating_market`` with the same arguments, per date."""
    leader = _leaders(np.random.default_rng(seed), n_days, n_assets, period, irregular)
    dates = pd.bdate_range(FIRST_DAY, periods=n_days)
    return pd.Series([f"R{i}" for i in leader], index=dates, name="leader")


def _rng(seed: int, family: int) -> np.random.Generator:
    """A family's own stream, so two families never share noise on one draw."""
    return np.random.default_rng([seed, family])


def mean_reversion_market(
    n_days: int = 1500, n_assets: int = 4, phi: float = -0.2, vol: float = 0.01, seed: int = 0
) -> pd.DataFrame:
    """Each asset's daily log return is AR(1) with a negative ``phi``: losers bounce back."""
    shocks = _rng(seed, 1).normal(0.0, vol, size=(n_days, n_assets))
    returns = np.empty_like(shocks)
    returns[0] = shocks[0]
    for t in range(1, n_days):
        returns[t] = phi * returns[t - 1] + shocks[t]
    return _prices(returns, [f"M{i}" for i in range(n_assets)])


def sector_names(n_sectors: int, per_sector: int) -> list[str]:
    """The assets of ``sector_market``, sector by sector: ``S0A, S0B, ..., S1A, ...``."""
    return [f"S{s}{chr(ord('A') + j)}" for s in range(n_sectors) for j in range(per_sector)]


def sector_covariance(
    n_sectors: int, per_sector: int, market_vol: float, sector_vol: float, idio_vol: float
) -> np.ndarray:
    """The daily return covariance of ``sector_market``: market, sector and own noise."""
    n = n_sectors * per_sector
    sector = np.repeat(np.arange(n_sectors), per_sector)
    same = (sector[:, None] == sector[None, :]).astype(float)
    return market_vol**2 + sector_vol**2 * same + idio_vol**2 * np.eye(n)


def sector_market(
    n_days: int = 1500,
    n_sectors: int = 3,
    per_sector: int = 2,
    period: float = 40.0,
    drift: float = 0.002,
    market_vol: float = 0.006,
    sector_vol: float = 0.006,
    idio_vol: float = 0.006,
    seed: int = 0,
) -> pd.DataFrame:
    """Correlated sectors with an irregularly rotating leader drifting up, the others down by as
    much: equal weight earns nothing."""
    rng = _rng(seed, 2)
    leader = _leaders(rng, n_days, n_sectors, period)
    mus = np.full((n_days, n_sectors), -drift / (n_sectors - 1))
    mus[np.arange(n_days), leader] = drift
    cov = sector_covariance(n_sectors, per_sector, market_vol, sector_vol, idio_vol)
    noise = rng.multivariate_normal(np.zeros(cov.shape[0]), cov, size=n_days)
    returns = np.repeat(mus, per_sector, axis=1) + noise
    return _prices(returns, sector_names(n_sectors, per_sector))


LISTINGS: tuple[tuple[int, int | None], ...] = (
    (0, None),
    (0, 600),
    (0, 900),
    (0, None),
    (250, None),
    (500, None),
    (750, None),
)
"""(first day, last day or None) of each asset of ``listing_market``."""


def listing_market(
    n_days: int = 1500,
    drift: float = 0.001,
    vol: float = 0.01,
    n_up: int = 3,
    listings: tuple[tuple[int, int | None], ...] = LISTINGS,
    seed: int = 0,
) -> pd.DataFrame:
    """Assets listing and delisting (NaN outside their span); ``listing_drifters`` drift up."""
    rng = _rng(seed, 3)
    mus = np.where(_listing_up(rng, n_up, listings), drift, 0.0)
    returns = rng.normal(mus, vol, size=(n_days, len(listings)))
    frame = _prices(returns, [f"L{i}" for i in range(len(listings))])
    for j, (first, last) in enumerate(listings):
        frame.iloc[:first, j] = np.nan
        if last is not None:
            frame.iloc[last + 1 :, j] = np.nan
    return frame


def _listing_up(
    rng: np.random.Generator, n_up: int, listings: tuple[tuple[int, int | None], ...]
) -> np.ndarray:
    survivors = [j for j, (_, last) in enumerate(listings) if last is None]
    first = int(rng.choice(survivors))
    others = [j for j in range(len(listings)) if j != first]
    up = np.zeros(len(listings), dtype=bool)
    up[[first, *rng.choice(others, size=n_up - 1, replace=False).tolist()]] = True
    return up


def listing_drifters(
    n_up: int = 3, listings: tuple[tuple[int, int | None], ...] = LISTINGS, seed: int = 0
) -> list[str]:
    """The drifting assets of ``listing_market`` with the same arguments."""
    return [f"L{j}" for j in np.flatnonzero(_listing_up(_rng(seed, 3), n_up, listings))]


def walk_market(
    n_days: int = 1500, n_assets: int = 4, vol: float = 0.01, seed: int = 0
) -> pd.DataFrame:
    """Independent driftless random walks of equal volatility: nothing to learn."""
    returns = _rng(seed, 4).normal(0.0, vol, size=(n_days, n_assets))
    return _prices(returns, [f"W{i}" for i in range(n_assets)])


GENERATORS: dict[str, Callable[..., pd.DataFrame]] = {
    "drift": drift_market,
    "rotating": rotating_market,
    "mean_reversion": mean_reversion_market,
    "sectors": sector_market,
    "listing": listing_market,
    "random_walk": walk_market,
}
"""Generator families by name; a market kind is one family with fixed parameters."""


@dataclass(frozen=True)
class GeneratedMarket:
    """One market kind: a generator with fixed parameters, its training and scored spans."""

    kind: str
    generator: str
    params: dict[str, Any] = field(default_factory=dict)
    train_start: str = "2000-01-01"
    train_end: str = "2003-12-31"
    validation_start: str = "2004-01-01"
    validation_end: str = "2005-12-31"
    signal: bool = True  # False: nothing is learnable, a policy should match its anchor

    def generate(self, draw: int) -> pd.DataFrame:
        """The draw's wide price frame (the draw number is the generator's seed)."""
        return GENERATORS[self.generator](**self.params, seed=draw)

    def dataset(self, draw: int) -> str:
        """The ``data.dataset`` value that loads this draw."""
        return f"{GENERATED_PREFIX}{self.kind}:{draw}"


MARKETS: dict[str, GeneratedMarket] = {
    m.kind: m
    for m in (
        GeneratedMarket("drift", "drift", {"n_flat": 3, "drift": 0.001, "vol": 0.01}),
        GeneratedMarket("rotating_short", "rotating", {"period": 20, "drift": 0.004, "vol": 0.006}),
        GeneratedMarket(
            "rotating_long",
            "rotating",
            {"period": 60, "drift": 0.002, "vol": 0.008, "irregular": True},
        ),
        GeneratedMarket("mean_reversion", "mean_reversion", {"phi": -0.3, "vol": 0.01}),
        GeneratedMarket("sectors", "sectors", {"n_sectors": 3, "per_sector": 2, "period": 40.0}),
        GeneratedMarket("entering_leaving", "listing", {"drift": 0.001, "vol": 0.01}),
        GeneratedMarket("random_walk", "random_walk", {"vol": 0.01}, signal=False),
    )
}
"""The suite's generated market kinds by name."""


def market(kind: str) -> GeneratedMarket:
    """The generated market ``kind``, or a ``ValueError`` listing the known ones."""
    try:
        return MARKETS[kind]
    except KeyError:
        raise ValueError(
            f"unknown generated market {kind!r}; known: {', '.join(MARKETS)}"
        ) from None


def parse_generated(dataset: str) -> tuple[str, int] | None:
    """``(kind, draw)`` of a ``generated:KIND:DRAW`` dataset name, else None."""
    if not dataset.startswith(GENERATED_PREFIX):
        return None
    kind, sep, draw = dataset[len(GENERATED_PREFIX) :].partition(":")
    if not sep or not draw.lstrip("-").isdigit():
        raise ValueError(f"dataset {dataset!r}: expected {GENERATED_PREFIX}KIND:DRAW")
    market(kind)
    return kind, int(draw)
