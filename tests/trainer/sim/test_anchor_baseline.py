"""The anchor baseline: the portfolio a tilt policy holds at a zero action, traded to daily."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from allocator.portfolio import AnchorSpec
from allocator.trainer.market.data import MarketData, from_wide
from allocator.trainer.sim.backtest import run_backtest
from allocator.trainer.sim.baselines import Anchor, EqualWeight, make_baseline

DATES = pd.bdate_range("2012-01-02", periods=90)


def noisy_market() -> MarketData:
    """Three assets with different volatilities (1%, 2%, 4% a day), seeded."""
    rng = np.random.default_rng(7)
    steps = rng.normal(0.0003, [0.01, 0.02, 0.04], size=(len(DATES), 3))
    prices = 100.0 * np.exp(np.cumsum(steps, axis=0))
    return from_wide(pd.DataFrame(prices, index=DATES, columns=list("ABC")), "noisy")


def test_an_equal_anchor_without_cash_is_equal_weight():
    data = noisy_market()
    anchor = run_backtest(Anchor(AnchorSpec("equal", cash_share=0.0)), data, DATES[30], DATES[-1])
    equal = run_backtest(EqualWeight(), data, DATES[30], DATES[-1])
    np.testing.assert_allclose(anchor.raw_weights, equal.raw_weights, atol=1e-15)
    np.testing.assert_allclose(anchor.returns, equal.returns, rtol=1e-12)


def test_inverse_volatility_weights_come_from_the_closes_before_each_decision():
    data = noisy_market()
    spec = AnchorSpec("inverse_volatility", cash_share=0.05, vol_window=20)
    res = run_backtest(make_baseline("anchor", spec=spec), data, DATES[30], DATES[-1])
    prices = pd.DataFrame(data.prices, index=data.dates, columns=data.assets)
    for date, row in res.raw_weights.iloc[[0, 17, -1]].iterrows():
        closes = prices.loc[:date].iloc[-21:]  # 20 daily returns up to the decision's close
        sigma = np.log(closes).diff().iloc[1:].std(ddof=0)
        expected = 0.95 * (1 / sigma) / (1 / sigma).sum()
        assert row["cash"] == pytest.approx(0.05, abs=1e-12)
        np.testing.assert_allclose(row[list("ABC")], expected[list("ABC")], rtol=1e-9)
    # The calmest asset gets the most, the wildest the least, every day.
    w = res.raw_weights
    assert (w["A"] > w["B"]).all()
    assert (w["B"] > w["C"]).all()


def test_the_anchor_needs_its_recipes_spec():
    with pytest.raises(ValueError, match="holds a tilt recipe's anchor"):
        make_baseline("anchor")
