"""Choosing a rule baseline's parameters on a span the comparison never scores.

A momentum rule whose lookback was picked on the days it is then compared on is a fitted
strategy reported as a simple one. Picking it here, on a span the caller passes (the training
span), and then backtesting the chosen rule on held-out days keeps the comparison fair. The
simple rules are top-k momentum and its mirror, top-k reversal (``select_simple_rule``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from allocator.trainer.market.data import DateLike, MarketData
from allocator.trainer.sim.backtest import run_backtest
from allocator.trainer.sim.baselines import TopKMomentum, TopKReversal


@dataclass(frozen=True)
class MomentumChoice:
    """The chosen rule and the net Sharpe of every candidate on the selection span."""

    rule: TopKMomentum
    sharpe: float
    scores: dict[str, float] = field(default_factory=dict)  # "lookback=20,k=1" -> Sharpe


def select_momentum(
    data: MarketData,
    start: DateLike,
    end: DateLike,
    *,
    lookbacks: Sequence[int],
    ks: Sequence[int] = (1,),
    cost_bps: float = 10.0,
    beta: float = 0.0,
    assets: Sequence[str] | None = None,
    rebalance_every: int = 1,
) -> MomentumChoice:
    """The top-k momentum rule with the best net Sharpe over ``[start, end]`` of ``data``.

    Every (lookback, k) pair is backtested with the given costs and smoothing; the first best
    in the order given wins a tie. ``start`` needs ``max(lookbacks)`` closes before it, so each
    candidate ranks on full lookbacks from the first decision (a ``DataError`` names the
    earliest possible start otherwise). No price after ``end`` affects the choice.
    """
    if not lookbacks or not ks:
        raise ValueError("select_momentum needs at least one lookback and one k")
    rules: dict[str, TopKMomentum] = {
        f"lookback={lookback},k={k}": TopKMomentum(lookback, k, rebalance_every)
        for lookback in lookbacks
        for k in ks
    }
    return best_rule(rules, data, start, end, cost_bps=cost_bps, beta=beta, assets=assets)


def select_simple_rule(
    data: MarketData,
    start: DateLike,
    end: DateLike,
    *,
    momentum_lookbacks: Sequence[int],
    reversal_lookbacks: Sequence[int],
    ks: Sequence[int] = (1,),
    cost_bps: float = 10.0,
    beta: float = 0.0,
    assets: Sequence[str] | None = None,
) -> MomentumChoice:
    """The best of top-k momentum and top-k reversal over ``[start, end]``: every (lookback, k)
    of each, keys ``momentum:lookback=L,k=K`` and ``reversal:lookback=L,k=K``; the same rules
    as ``select_momentum`` for ties and for the closes ``start`` needs (the longest lookback
    of either family)."""
    if not (momentum_lookbacks or reversal_lookbacks) or not ks:
        raise ValueError("select_simple_rule needs at least one lookback and one k")
    rules: dict[str, TopKMomentum] = {}
    for family, lookbacks in (
        (TopKMomentum, momentum_lookbacks),
        (TopKReversal, reversal_lookbacks),
    ):
        for lookback in lookbacks:
            for k in ks:
                rules[f"{family.name}:lookback={lookback},k={k}"] = family(lookback, k)
    return best_rule(rules, data, start, end, cost_bps=cost_bps, beta=beta, assets=assets)


def best_rule(
    rules: dict[str, TopKMomentum],
    data: MarketData,
    start: DateLike,
    end: DateLike,
    *,
    cost_bps: float,
    beta: float,
    assets: Sequence[str] | None,
) -> MomentumChoice:
    """The rule with the best net Sharpe over ``[start, end]``; the first of equal scores."""
    window = max(rule.lookback for rule in rules.values())
    scores: dict[str, float] = {}
    for key, rule in rules.items():
        result = run_backtest(
            rule, data, start, end, assets, cost_bps=cost_bps, beta=beta, window=window
        )
        scores[key] = result.metrics()["sharpe"]
    # max keeps the first of equal scores; a NaN Sharpe (a flat book) never wins.
    best = max(scores, key=lambda key: -math.inf if math.isnan(scores[key]) else scores[key])
    return MomentumChoice(rule=rules[best], sharpe=scores[best], scores=scores)
