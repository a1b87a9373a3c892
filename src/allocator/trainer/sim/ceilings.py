"""Ceilings: the Bayes decision (or filter) of a generated market given its true parameters. A
reference, not a bound: it ignores costs, so a policy that trades less can beat it on a draw."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from allocator.trainer.market.generated import (
    GeneratedMarket,
    listing_drifters,
    sector_covariance,
    sector_names,
)
from allocator.trainer.sim.baselines import DecisionContext, Policy


class RegimeFilter:
    """Forward filter of a hidden regime redrawn with probability ``1 / period`` per close;
    subclasses give the Gaussian likelihood and the book."""

    def __init__(self, n_states: int, period: float, drift: float) -> None:
        self.means = np.full((n_states, n_states), -drift / (n_states - 1))  # (regime, state)
        np.fill_diagonal(self.means, drift)
        redraw = 1.0 / period
        self.transition = np.full((n_states, n_states), redraw / n_states)
        self.transition += np.eye(n_states) * (1.0 - redraw)
        self.n_states = n_states
        self.reset()

    def reset(self) -> None:
        self.posterior = np.full(self.n_states, 1.0 / self.n_states)
        self.seen = 1  # closes already folded into the posterior

    def loglik(self, r: NDArray[np.float64]) -> NDArray[np.float64]:
        """Log-likelihood of one day's log returns under each regime (up to a constant)."""
        raise NotImplementedError

    def update(self, prices: NDArray[np.float64], step: int = -1) -> NDArray[np.float64]:
        """The posterior after folding in the closes not seen yet (step 0 starts again)."""
        if step == 0 or len(prices) < self.seen:
            self.reset()
        for r in np.diff(np.log(prices[self.seen - 1 :]), axis=0):
            loglik = self.loglik(r)
            joint = (self.posterior @ self.transition) * np.exp(loglik - loglik.max())
            self.posterior = joint / joint.sum()
        self.seen = len(prices)
        return self.posterior


class RotationFilter(RegimeFilter):
    """The Bayes filter of ``rotating_market``: holds the most probable leader (``book="leader"``)
    or each asset at its probability of leading (``book="posterior"``)."""

    def __init__(
        self,
        n_assets: int = 4,
        period: float = 20,
        drift: float = 0.004,
        vol: float = 0.006,
        book: str = "leader",
    ) -> None:
        if book not in ("leader", "posterior"):
            raise ValueError(f"book must be 'leader' or 'posterior', got {book!r}")
        self.name = f"rotation-filter-{book}"
        self.book = book
        self.var = vol**2
        super().__init__(n_assets, period, drift)

    def loglik(self, r: NDArray[np.float64]) -> NDArray[np.float64]:
        return -((r - self.means) ** 2).sum(axis=1) / (2 * self.var)

    def __call__(self, ctx: DecisionContext) -> NDArray[np.float64]:
        posterior = self.update(ctx.prices, ctx.step)
        if self.book == "posterior":
            return ctx.slot_weights(posterior)
        return ctx.slot_weights(np.eye(posterior.size)[np.argmax(posterior)])


class SectorFilter(RegimeFilter):
    """The Bayes filter of ``sector_market``: holds the most probable leader's assets equally."""

    name = "sector-filter"

    def __init__(
        self,
        n_sectors: int = 3,
        per_sector: int = 2,
        period: float = 40.0,
        drift: float = 0.002,
        market_vol: float = 0.006,
        sector_vol: float = 0.006,
        idio_vol: float = 0.006,
    ) -> None:
        super().__init__(n_sectors, period, drift)
        self.means = np.repeat(self.means, per_sector, axis=1)  # (regime, asset)
        cov = sector_covariance(n_sectors, per_sector, market_vol, sector_vol, idio_vol)
        self.precision = np.linalg.inv(cov)
        self.names = sector_names(n_sectors, per_sector)

    def loglik(self, r: NDArray[np.float64]) -> NDArray[np.float64]:
        d = r - self.means
        return -0.5 * np.einsum("si,ij,sj->s", d, self.precision, d)

    def __call__(self, ctx: DecisionContext) -> NDArray[np.float64]:
        columns = [self.names.index(a) for a in ctx.assets]
        if len(columns) != len(self.names):
            raise ValueError("the sector filter needs every asset of the market")
        prices = np.empty_like(ctx.prices)
        prices[:, columns] = ctx.prices
        posterior = self.update(prices, ctx.step)  # folds in the closes not seen yet
        held = self.means[np.argmax(posterior)] > 0
        return ctx.slot_weights(held[columns] / held.sum())


class KnownDrift:
    """Equal weight over the live assets known to drift up (all live assets when none is)."""

    name = "known-drift"

    def __init__(self, drifting: Sequence[str]) -> None:
        self.drifting = set(drifting)

    def __call__(self, ctx: DecisionContext) -> NDArray[np.float64]:
        up = np.array([a in self.drifting for a in ctx.assets], dtype=np.float64)
        if not up.any():
            up[:] = 1.0
        return ctx.slot_weights(up / up.sum())


class KnownReversal:
    """The AR(1) rule with the true ``phi``: hold the highest expected next log return."""

    name = "known-reversal"

    def __init__(self, phi: float) -> None:
        self.phi = phi

    def __call__(self, ctx: DecisionContext) -> NDArray[np.float64]:
        expected = self.phi * np.diff(np.log(ctx.prices[-2:]), axis=0)[0]
        return ctx.slot_weights(np.eye(len(ctx.assets))[np.argmax(expected)])


def ceiling_for(market: GeneratedMarket, draw: int) -> Policy | None:
    """The ceiling of ``market``'s draw ``draw``, None where nothing is known to be learnable."""
    p = market.params
    if market.generator == "drift":
        return KnownDrift(["UP"])
    if market.generator == "rotating":
        return RotationFilter(**{k: p[k] for k in ("n_assets", "period", "drift", "vol") if k in p})
    if market.generator == "sectors":
        return SectorFilter(**p)
    if market.generator == "mean_reversion":
        return KnownReversal(p.get("phi", -0.2))
    if market.generator == "listing":
        keys = ("n_up", "listings")
        return KnownDrift(listing_drifters(**{k: p[k] for k in keys if k in p}, seed=draw))
    return None
