"""Top-k momentum: holds what it should, reads no price after its decision, and its lookback
is chosen on the span it is given and nowhere else."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from allocator.trainer.market.data import MarketData, from_wide
from allocator.trainer.sim.backtest import run_backtest
from allocator.trainer.sim.baselines import BaselineName, TopKMomentum, make_baseline
from allocator.trainer.sim.rule_selection import select_simple_rule

DATES = pd.bdate_range("2010-01-04", periods=120)


def steady_market() -> MarketData:
    """Four assets with constant daily log returns: B > D > A > C every day."""
    rates = np.array([0.001, 0.004, -0.002, 0.002])
    prices = 100.0 * np.exp(np.outer(np.arange(len(DATES)), rates))
    return from_wide(pd.DataFrame(prices, index=DATES, columns=list("ABCD")), "steady")


def test_equal_weight_over_the_top_k_and_no_cash():
    data = steady_market()
    res = run_backtest(TopKMomentum(lookback=10, k=2), data, DATES[30], DATES[-1])
    expected = {"cash": 0.0, "A": 0.0, "B": 0.5, "C": 0.0, "D": 0.5}
    for col, w in expected.items():
        np.testing.assert_allclose(res.raw_weights[col], w, atol=1e-12, err_msg=col)
    top1 = run_backtest(TopKMomentum(lookback=10, k=1), data, DATES[30], DATES[-1])
    np.testing.assert_allclose(top1.raw_weights["B"], 1.0)
    everything = run_backtest(TopKMomentum(lookback=10, k=9), data, DATES[30], DATES[-1])
    np.testing.assert_allclose(everything.raw_weights[list("ABCD")], 0.25)


def test_lookback_counts_exactly_lookback_returns():
    """A's jump is one close older than a 5-day window: only the 6-day rule sees it."""
    closes = np.ones((12, 2))
    closes[:, 1] = 1.0 + 0.01 * np.arange(12)  # B: +1% of its start price a day
    closes[6:, 0] = 2.0  # A doubles from close 5 to close 6, flat after
    assert TopKMomentum(lookback=5, k=1).chosen(closes).tolist() == [1]
    assert TopKMomentum(lookback=6, k=1).chosen(closes).tolist() == [0]
    # Shorter history than the lookback: the return over what there is.
    assert TopKMomentum(lookback=50, k=1).chosen(closes).tolist() == [0]


def test_ties_go_to_the_earlier_slot_and_a_missing_close_ranks_last():
    flat = np.ones((10, 3))
    assert TopKMomentum(lookback=5, k=2).chosen(flat).tolist() == [0, 1]
    rising = np.outer(1.0 + 0.01 * np.arange(10), np.ones(3))
    rising[:4, 0] = np.nan  # listed late: no close at the start of the window
    assert TopKMomentum(lookback=6, k=2).chosen(rising).tolist() == [1, 2]


def test_decisions_use_no_price_after_their_date():
    rng = np.random.default_rng(0)
    prices = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.02, (len(DATES), 5)), axis=0))
    frame = pd.DataFrame(prices, index=DATES, columns=[f"X{i}" for i in range(5)])
    cut = 80
    poisoned = frame.copy()
    poisoned.iloc[cut:] *= rng.uniform(0.2, 5.0, poisoned.iloc[cut:].shape)
    rule = TopKMomentum(lookback=7, k=2)
    clean = run_backtest(rule, from_wide(frame, "clean"), DATES[30], DATES[-1])
    dirty = run_backtest(rule, from_wide(poisoned, "poisoned"), DATES[30], DATES[-1])
    before = clean.raw_weights.index < DATES[cut]
    pd.testing.assert_frame_equal(clean.raw_weights[before], dirty.raw_weights[before])
    # The poison does change later decisions: the comparison above could fail.
    assert not clean.raw_weights[~before].equals(dirty.raw_weights[~before])


def test_rebalance_every_leaves_the_book_alone_in_between():
    rng = np.random.default_rng(1)
    prices = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.02, (len(DATES), 4)), axis=0))
    data = from_wide(pd.DataFrame(prices, index=DATES, columns=list("ABCD")), "walk")
    res = run_backtest(
        TopKMomentum(lookback=10, k=2, rebalance_every=5), data, DATES[30], DATES[-1]
    )
    steps = np.arange(len(res.turnover))
    assert np.all(res.turnover.to_numpy()[steps % 5 != 0] < 1e-12)
    assert res.turnover.to_numpy()[steps % 5 == 0][1:].max() > 0.1


def test_registered_as_momentum_with_documented_defaults():
    rule = make_baseline(BaselineName.MOMENTUM)
    assert isinstance(rule, TopKMomentum)
    assert (rule.lookback, rule.k, rule.rebalance_every) == (63, 3, 1)
    assert make_baseline("momentum", lookback=5, k=1).k == 1
    with pytest.raises(ValueError, match="lookback, k and rebalance_every"):
        TopKMomentum(lookback=0)


def two_regime_market() -> tuple[MarketData, pd.DatetimeIndex]:
    """300 days where a fast rotation pays a short lookback, then 300 where only a long one
    finds the steady riser among assets that swing +-5% every 10 days."""
    n, half = 4, 300
    t = np.arange(half)
    first = np.full((half, n), -0.004)
    first[t, (t // 8) % n] = 0.012  # each asset leads in turn for 8 days
    swings = 0.05 * np.sin(2 * np.pi * t[:, None] / 10 + np.array([0.0, 1.5, 0.0, 3.0]))
    swings[:, 2] = 0.003 * t
    second = np.diff(np.vstack([np.zeros(n), swings]), axis=0)
    dates = pd.bdate_range("2010-01-04", periods=2 * half)
    log_prices = np.cumsum(np.vstack([first, second]), axis=0)
    frame = pd.DataFrame(100.0 * np.exp(log_prices), index=dates, columns=list("ABCD"))
    return from_wide(frame, "two-regime"), dates


def test_selection_picks_the_lookback_that_wins_on_the_given_span():
    data, d = two_regime_market()
    grid = {"momentum_lookbacks": (5, 60), "reversal_lookbacks": (), "cost_bps": 10}
    fast = select_simple_rule(data, d[60], d[299], **grid)
    slow = select_simple_rule(data, d[360], d[-1], **grid)
    assert (fast.rule.lookback, slow.rule.lookback) == (5, 60)
    assert fast.scores["momentum:lookback=5,k=1"] > fast.scores["momentum:lookback=60,k=1"]
    # The score is the candidate's own net Sharpe over the span, with the span's costs.
    again = run_backtest(TopKMomentum(60, 1), data, d[360], d[-1], cost_bps=10, window=60)
    assert slow.sharpe == pytest.approx(again.metrics()["sharpe"])


def test_selection_reads_nothing_after_its_span():
    data, d = two_regime_market()
    # The second regime replaced by noise: the choice on the first span must not move.
    rng = np.random.default_rng(2)
    prices = data.prices.copy()
    prices[300:] = prices[299] * np.exp(np.cumsum(rng.normal(0, 0.05, (300, 4)), axis=0))
    noisy = from_wide(pd.DataFrame(prices, index=d, columns=list("ABCD")), "noisy")
    kwargs = {"momentum_lookbacks": (5, 20, 60), "reversal_lookbacks": (), "ks": (1, 2)}
    clean = select_simple_rule(data, d[60], d[299], cost_bps=10, **kwargs)
    dirty = select_simple_rule(noisy, d[60], d[299], cost_bps=10, **kwargs)
    assert clean.scores == dirty.scores
    assert repr(clean.rule) == repr(dirty.rule)
    assert clean.rule.lookback == 5
