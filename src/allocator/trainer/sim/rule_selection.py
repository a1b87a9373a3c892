"""Choosing a rule baseline's parameters on a span the comparison never scores: a lookback
picked on the scored days would be a fitted strategy reported as a simple one."""

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
    scores: dict[str, float] = field(default_factory=dict)  # "momentum:lookback=20,k=1" -> Sharpe


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
    """The best of top-k momentum and reversal (keys ``momentum:lookback=L,k=K``, ...) by net
    Sharpe over ``[start, end]`` (first of equals); ``start`` needs ``max(lookbacks)`` closes."""
    if not (momentum_lookbacks or reversal_lookbacks) or not ks:
        raise ValueError("select_simple_rule needs at least one lookback and one k")
    families = ((TopKMomentum, momentum_lookbacks), (TopKReversal, reversal_lookbacks))
    rules: dict[str, TopKMomentum] = {
        f"{family.name}:lookback={lookback},k={k}": family(lookback, k)
        for family, lookbacks in families
        for lookback in lookbacks
        for k in ks
    }
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
