"""Baseline policies a user would pick instead of an RL agent: ``DecisionContext`` -> target
weights (cash first). Fitted ones (min-variance, HRP) see only returns up to the decision."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import Any, Protocol

import numpy as np
import pandas as pd
from numpy.typing import NDArray
from skfolio.optimization import HierarchicalRiskParity, MeanRisk, ObjectiveFunction

from allocator.portfolio import AnchorSpec, action_to_weights, anchor_weights


@dataclass(frozen=True)
class DecisionContext:
    """What a policy may look at when deciding at the close of ``date``."""

    date: pd.Timestamp
    step: int  # decisions made so far in this run
    assets: tuple[str, ...]  # live assets, in slot order (slot i + 1 holds assets[i])
    prices: NDArray[np.float64]  # (t + 1, len(assets)) closes up to and including ``date``
    weights: NDArray[np.float64]  # current (drifted) weights, cash first, length n_slots
    mask: NDArray[np.bool_]
    observation: NDArray[np.float32]
    # The environment's action -> weights mapping at this decision (the tilt mapping needs the
    # decision's anchor); None means the affine contract mapping.
    to_weights: Callable[[NDArray[np.float32]], NDArray[np.float64]] | None = None

    @property
    def n_slots(self) -> int:
        return int(self.mask.size)

    def slot_weights(
        self, asset_weights: NDArray[np.float64], cash: float = 0.0
    ) -> NDArray[np.float64]:
        """Per-asset weights (in ``assets`` order) and a cash weight in slot layout, scaled to 1."""
        w = np.zeros(self.n_slots)
        w[0] = cash
        w[1 : 1 + len(self.assets)] = asset_weights
        return w / w.sum()


class Policy(Protocol):
    """Anything that returns target weights for a decision."""

    def __call__(self, ctx: DecisionContext, /) -> NDArray[np.float64]: ...


class ActionPolicy:
    """Adapts an actor (observation -> action in [-1, 1]) to a weights policy via the contract."""

    def __init__(self, actor: Any, name: str = "agent") -> None:
        self.actor = actor
        self.name = name

    def __call__(self, ctx: DecisionContext) -> NDArray[np.float64]:
        action = self.actor(ctx.observation)
        if ctx.to_weights is not None:
            return ctx.to_weights(action)
        return action_to_weights(action, ctx.mask)


class Cash:
    """Everything in cash: the zero line every strategy should beat after costs."""

    name = "cash"

    def __call__(self, ctx: DecisionContext) -> NDArray[np.float64]:
        return ctx.slot_weights(np.zeros(len(ctx.assets)), cash=1.0)


class Rebalancing:
    """Trades to ``target`` every ``rebalance_every`` decisions; the weights drift between."""

    def __init__(self, rebalance_every: int = 1) -> None:
        self.rebalance_every = rebalance_every

    def __call__(self, ctx: DecisionContext) -> NDArray[np.float64]:
        return ctx.weights if ctx.step % self.rebalance_every else self.target(ctx)

    def target(self, ctx: DecisionContext) -> NDArray[np.float64]:
        raise NotImplementedError


class EqualWeight(Rebalancing):
    """1/N over the live assets, rebalanced every ``rebalance_every`` days (1 = daily)."""

    name = "equal-weight"

    def target(self, ctx: DecisionContext) -> NDArray[np.float64]:
        n = len(ctx.assets)
        return ctx.slot_weights(np.full(n, 1.0 / n))


class BuyAndHold(EqualWeight):
    """1/N once at the start, then let the weights drift: no further trades."""

    name = "buy-and-hold"

    def __init__(self) -> None:
        super().__init__(rebalance_every=sys.maxsize)


class _FittedOptimizer(Rebalancing):
    """Refit a skfolio optimiser on trailing returns every ``rebalance_every`` days."""

    name = "optimizer"
    estimator: Callable[[], Any]  # a fresh, unfitted skfolio optimiser

    def __init__(self, lookback: int = 252, rebalance_every: int = 21) -> None:
        super().__init__(rebalance_every)
        self.lookback = lookback

    def fit_weights(
        self, prices: NDArray[np.float64], assets: tuple[str, ...]
    ) -> NDArray[np.float64]:
        window = prices[-(self.lookback + 1) :]
        returns = pd.DataFrame(window[1:] / window[:-1] - 1.0, columns=list(assets))
        if len(returns) < 2:
            raise ValueError(f"{self.name} needs at least 3 closes before its first decision")
        model = self.estimator()
        model.fit(returns)
        return np.clip(np.asarray(model.weights_, dtype=np.float64), 0.0, None)

    def target(self, ctx: DecisionContext) -> NDArray[np.float64]:
        return ctx.slot_weights(self.fit_weights(ctx.prices, ctx.assets))


class MinVariance(_FittedOptimizer):
    """skfolio's long-only minimum-variance portfolio."""

    name = "min-variance"
    estimator = partial(MeanRisk, objective_function=ObjectiveFunction.MINIMIZE_RISK)


class HRP(_FittedOptimizer):
    """skfolio's hierarchical risk parity."""

    name = "hrp"
    estimator = HierarchicalRiskParity


class TopKMomentum(Rebalancing):
    """Equal weight over the ``k`` assets with the highest trailing ``lookback``-day return:
    the rule a trend-following allocator must beat (ties: the earlier slot)."""

    name = "momentum"
    sign = 1.0  # ranks by sign * trailing return, highest first

    def __init__(self, lookback: int = 63, k: int = 3, rebalance_every: int = 1) -> None:
        if lookback < 1 or k < 1 or rebalance_every < 1:
            raise ValueError(
                f"momentum needs lookback, k and rebalance_every >= 1, got {lookback}, {k}, "
                f"{rebalance_every}"
            )
        super().__init__(rebalance_every)
        self.lookback = lookback
        self.k = k

    def __repr__(self) -> str:
        return f"{type(self).__name__}(lookback={self.lookback}, k={self.k})"

    def chosen(self, prices: NDArray[np.float64]) -> NDArray[np.intp]:
        if len(prices) < 2:
            raise ValueError(f"{self.name} needs at least 2 closes before its first decision")
        window = prices[-(self.lookback + 1) :]
        with np.errstate(divide="ignore", invalid="ignore"):
            key = -self.sign * (window[-1] / window[0] - 1.0)
        # A stable sort, lowest key first: the earlier slot wins a tie, no close ranks last.
        return np.argsort(np.where(np.isfinite(key), key, np.inf), kind="stable")[: self.k]

    def target(self, ctx: DecisionContext) -> NDArray[np.float64]:
        top = self.chosen(ctx.prices)
        w = np.zeros(len(ctx.assets))
        w[top] = 1.0 / len(top)
        return ctx.slot_weights(w)


class TopKReversal(TopKMomentum):
    """The mirror of ``TopKMomentum``: the ``k`` lowest trailing returns (losers bounce back)."""

    name = "reversal"
    sign = -1.0


class Anchor:
    """A tilt policy's zero-action portfolio, traded to daily: does the tilt add anything?"""

    name = "anchor"

    def __init__(self, spec: AnchorSpec | None = None) -> None:
        if spec is None:
            raise ValueError(
                "the anchor baseline holds a tilt recipe's anchor: give its AnchorSpec "
                "(a walk-forward takes the trainer's env.action.anchor)"
            )
        self.spec = spec

    def __repr__(self) -> str:
        return f"Anchor({self.spec.to_dict()})"

    def __call__(self, ctx: DecisionContext) -> NDArray[np.float64]:
        window = ctx.prices[-self.spec.prices_per_asset :].T  # (assets, closes)
        w = anchor_weights(window, np.ones(len(ctx.assets) + 1, dtype=bool), self.spec)
        return ctx.slot_weights(w[1:], cash=float(w[0]))


class AnchorPolicy:
    """A tilt policy's zero action through the backtest's own environment: its anchor bit for
    bit (``Anchor`` recomputes it from a spec)."""

    name = "anchor"

    def __call__(self, ctx: DecisionContext) -> NDArray[np.float64]:
        if ctx.to_weights is None:
            raise ValueError("the anchor policy needs the environment's tilt mapping")
        return ctx.to_weights(np.zeros(ctx.n_slots, dtype=np.float32))


class BaselineName(StrEnum):
    EQUAL_WEIGHT = "equal-weight"
    BUY_AND_HOLD = "buy-and-hold"
    CASH = "cash"
    MIN_VARIANCE = "min-variance"
    HRP = "hrp"
    MOMENTUM = "momentum"
    ANCHOR = "anchor"


ANCHOR = BaselineName.ANCHOR.value
"""A tilt recipe's own anchor: the excess Sharpe over it is what the learned tilt adds."""

NEEDS_RECIPE: frozenset[BaselineName] = frozenset({BaselineName.ANCHOR})
"""Baselines defined by a trained recipe (its anchor): they cannot run from a name alone."""


def make_baseline(name: str | BaselineName, **kwargs: Any) -> Policy:
    """A baseline policy by name; unknown names list the valid ones."""
    try:
        key = BaselineName(name)
    except ValueError:
        valid = ", ".join(b.value for b in BaselineName)
        raise ValueError(f"unknown baseline {name!r}; choose one of: {valid}") from None
    classes = (EqualWeight, BuyAndHold, Cash, MinVariance, HRP, TopKMomentum, Anchor)
    return {c.name: c for c in classes}[key](**kwargs)
