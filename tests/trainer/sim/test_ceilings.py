"""Simple rules and ceilings on the suite's generated markets: the reversal rule, the choice
among momentum and reversal on the training span, and ceilings that beat that choice on
held-out days where the market's model leaves room (and nothing where it leaves none)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from allocator.trainer.market.data import from_wide, load_dataset
from allocator.trainer.market.generated import market
from allocator.trainer.sim.backtest import run_backtest
from allocator.trainer.sim.baselines import EqualWeight, TopKReversal
from allocator.trainer.sim.ceilings import ceiling_for
from allocator.trainer.sim.rule_selection import select_simple_rule

GRID = {"momentum_lookbacks": (10, 40), "reversal_lookbacks": (1, 5), "ks": (1,)}


def held_out(kind: str, draw: int) -> dict[str, float]:
    """Held-out Sharpe of the rule chosen on the training span, equal weight and the ceiling,
    over the assets listed through the held-out span."""
    m = market(kind)
    data = load_dataset(m.dataset(draw))
    alive = data.last_valid() == data.n_dates - 1
    assets = [a for a, keep in zip(data.assets, alive, strict=True) if keep]
    first = int(data.select(assets).first_valid().max())
    start = max(pd.Timestamp(m.train_start), data.dates[first + 40])
    choice = select_simple_rule(data, start, m.train_end, assets=assets, **GRID)
    span = {"start": m.validation_start, "end": m.validation_end, "assets": assets}
    out = {
        "rule": run_backtest(choice.rule, data, **span).metrics()["sharpe"],
        "equal_weight": run_backtest(EqualWeight(), data, **span).metrics()["sharpe"],
    }
    ceiling = ceiling_for(m, draw)
    if ceiling is not None:
        out["ceiling"] = run_backtest(ceiling, data, **span).metrics()["sharpe"]
    return out


def test_reversal_holds_the_biggest_losers():
    prices = pd.DataFrame(
        {"A": [10.0, 11.0, 12.0], "B": [10.0, 9.0, 8.0], "C": [10.0, 10.0, 10.0]},
        index=pd.bdate_range("2020-01-01", periods=3),
    )
    rule = TopKReversal(lookback=2, k=2)
    assert sorted(rule.chosen(prices.to_numpy())) == [1, 2]
    assert list(TopKReversal(lookback=1, k=1).chosen(prices.to_numpy())) == [1]


def test_the_simple_rule_is_chosen_among_both_families_on_the_given_span_only():
    frame = market("mean_reversion").generate(100)
    data = from_wide(frame, "test")
    choice = select_simple_rule(data, "2000-03-01", "2003-12-31", **GRID)
    assert set(choice.scores) == {
        "momentum:lookback=10,k=1",
        "momentum:lookback=40,k=1",
        "reversal:lookback=1,k=1",
        "reversal:lookback=5,k=1",
    }
    assert repr(choice.rule) == "TopKReversal(lookback=1, k=1)"  # the market's own answer
    later = frame.copy()
    later.loc["2004-01-01":] = np.random.default_rng(0).uniform(1, 1000, later.loc["2004":].shape)
    poisoned = select_simple_rule(from_wide(later, "test"), "2000-03-01", "2003-12-31", **GRID)
    assert poisoned.scores == choice.scores


@pytest.mark.parametrize("kind", ["drift", "sectors", "entering_leaving", "rotating_short"])
def test_the_ceiling_beats_the_training_span_rule_on_average(kind):
    runs = [held_out(kind, draw) for draw in range(100, 104)]
    gap = np.mean([r["ceiling"] - r["rule"] for r in runs])
    assert gap > 0.2, runs


def test_on_the_random_walk_the_best_training_span_rule_gains_nothing():
    runs = [held_out("random_walk", draw) for draw in range(100, 108)]
    excess = np.array([r["rule"] - r["equal_weight"] for r in runs])
    assert "ceiling" not in runs[0]
    # Nothing to learn: the chosen rule does not beat equal weight out of sample on average
    # (it pays costs for nothing), and its edge on the training span does not carry over.
    assert excess.mean() < 0.1, excess
