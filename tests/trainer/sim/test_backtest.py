"""Backtests: numbers a user can recompute, no look-ahead, and the CLI around them."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from skfolio.datasets import load_sp500_dataset

from allocator.cli import main
from allocator.portfolio import AnchorSpec, ema_smooth
from allocator.trainer.market.data import DataError, MarketData, from_wide, load_sp500
from allocator.trainer.sim.backtest import run_backtest
from allocator.trainer.sim.baselines import NEEDS_RECIPE, BaselineName, MinVariance, make_baseline


@pytest.fixture(scope="module")
def sp500() -> MarketData:
    return load_sp500()


def equal_weight_by_hand(start: str, end: str, cost_bps: float) -> tuple[float, float]:
    """Daily-rebalanced 1/N from the raw prices with pandas alone: (Sharpe, total return).

    Day 0 buys 1/N of everything from cash (turnover 1). Each later day the holdings have
    drifted to g_i / sum(g) (g = yesterday-to-today growth) and are traded back to 1/N,
    paying cost * sum_i |1/N - drifted_i| of NAV before the day's move.
    """
    prices = load_sp500_dataset().loc[start:end]
    growth = prices / prices.shift(1)  # row t: P_t / P_{t-1}
    n = prices.shape[1]
    drifted = growth.div(growth.sum(axis=1), axis=0)
    turnover = (1.0 / n - drifted).abs().sum(axis=1)
    turnover.iloc[0] = 1.0
    cost = cost_bps / 1e4
    # The decision on day t earns the move from t to t+1.
    net = (1.0 - cost * turnover.iloc[:-1].to_numpy()) * growth.mean(axis=1).iloc[1:].to_numpy()
    returns = pd.Series(net - 1.0)
    sharpe = returns.mean() / returns.std(ddof=1) * math.sqrt(252)
    total = float((1.0 + returns).prod() - 1.0)
    return float(sharpe), total


def test_equal_weight_matches_pandas_recomputation(tmp_path):
    out = tmp_path / "ew.json"
    result = CliRunner().invoke(
        main,
        [
            "backtest",
            "--policy",
            "equal-weight",
            "--start",
            "2010-01-01",
            "--end",
            "2019-12-31",
            "--cost-bps",
            "10",
            "--json-out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    got = json.loads(out.read_text())
    sharpe, total = equal_weight_by_hand("2010-01-01", "2019-12-31", 10.0)
    assert got["sharpe"] == pytest.approx(sharpe, abs=1e-6)
    assert got["total_return"] == pytest.approx(total, abs=1e-6)
    for key in (
        "sharpe",
        "sortino",
        "max_drawdown",
        "total_return",
        "annual_return",
        "annual_volatility",
        "turnover",
        "costs",
    ):
        assert isinstance(got[key], float), key


def test_costs_lower_equal_weight_returns(sp500):
    free = run_backtest("equal-weight", sp500, "2012-01-01", "2013-12-31", cost_bps=0.0)
    paid = run_backtest("equal-weight", sp500, "2012-01-01", "2013-12-31", cost_bps=25.0)
    assert free.costs.sum() == 0.0
    assert paid.nav.iloc[-1] < free.nav.iloc[-1]
    assert paid.metrics()["costs"] > 0.0


def test_cash_stays_flat_and_buy_and_hold_trades_once(sp500):
    cash = run_backtest("cash", sp500, "2015-01-01", "2015-12-31")
    assert np.all(cash.nav.to_numpy() == 1.0)
    assert cash.metrics()["sharpe"] == 0.0
    hold = run_backtest("buy-and-hold", sp500, "2015-01-01", "2015-12-31", cost_bps=10.0)
    assert hold.turnover.iloc[0] == pytest.approx(1.0)
    assert np.all(np.abs(hold.turnover.iloc[1:].to_numpy()) < 1e-12)
    # With no trades after day one, NAV is the initial basket (bought net of 10 bps on the
    # whole NAV) marked to market.
    assets = hold.settings["assets"]
    px = sp500.to_frame().loc[hold.nav.index, assets]
    basket = (1.0 - 1e-3) * (px / px.iloc[0]).mean(axis=1)
    np.testing.assert_allclose(hold.nav.to_numpy()[1:], basket.to_numpy()[1:], rtol=1e-10)


def test_smoothing_executes_ema_of_raw_weights(sp500):
    res = run_backtest("min-variance", sp500, "2016-01-01", "2016-06-30", beta=0.8)
    raw, exe = res.raw_weights.to_numpy(), res.executed_weights.to_numpy()
    mask = np.ones(raw.shape[1], dtype=bool)
    prev = None
    for k in range(len(raw)):
        prev = ema_smooth(prev, raw[k], mask, 0.8)
        np.testing.assert_allclose(exe[k], prev, atol=1e-12)
    assert np.abs(raw - exe).max() > 1e-3  # the smoothing did something


def test_fitted_baseline_never_sees_the_future(sp500):
    """Scrambling prices after a date leaves every decision up to that date unchanged."""
    data = sp500.between("2017-01-01", "2018-12-31")
    cut = data.date_index("2018-03-01")
    rng = np.random.default_rng(0)
    scrambled = data.prices.copy()
    scrambled[cut + 1 :] *= rng.uniform(0.5, 1.5, size=scrambled[cut + 1 :].shape)
    other = MarketData(scrambled, data.dates, data.assets, "scrambled")
    a = run_backtest(MinVariance(lookback=120, rebalance_every=5), data, "2017-09-01", "2018-12-31")
    b = run_backtest(
        MinVariance(lookback=120, rebalance_every=5), other, "2017-09-01", "2018-12-31"
    )
    upto = a.raw_weights.index <= data.dates[cut]
    np.testing.assert_allclose(a.raw_weights[upto], b.raw_weights[upto], atol=1e-9)
    assert not np.allclose(a.raw_weights[~upto], b.raw_weights[~upto], atol=1e-6)


def test_synthetic_drift_asset_is_found_by_min_variance_vs_equal_weight():
    """On a market of one calm and one wild asset, min-variance holds mostly the calm one."""
    rng = np.random.default_rng(3)
    dates = pd.bdate_range("2020-01-01", periods=400)
    calm = 100 * np.exp(np.cumsum(rng.normal(0.0003, 0.002, 400)))
    wild = 100 * np.exp(np.cumsum(rng.normal(0.0003, 0.03, 400)))
    data = from_wide(pd.DataFrame({"CALM": calm, "WILD": wild}, index=dates), "synthetic")
    res = run_backtest(MinVariance(lookback=100, rebalance_every=10), data, dates[150], dates[-1])
    assert res.raw_weights["CALM"].mean() > 0.9
    ew = run_backtest("equal-weight", data, dates[150], dates[-1])
    assert res.metrics()["annual_volatility"] < ew.metrics()["annual_volatility"]


@pytest.mark.parametrize("name", [b.value for b in BaselineName])
def test_every_baseline_yields_valid_weights_and_metrics(sp500, name):
    # The anchor is a recipe's: it runs by name once given the recipe's spec.
    policy = make_baseline(name, spec=AnchorSpec("hrp")) if name in NEEDS_RECIPE else name
    res = run_backtest(policy, sp500, "2019-01-01", "2019-06-30", assets=["AAPL", "KO", "XOM"])
    w = res.raw_weights.to_numpy()
    assert np.all(w >= -1e-12)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-9)
    m = res.metrics()
    assert m["days"] == len(res.nav) - 1
    assert np.isfinite(m["total_return"])


def test_backtest_errors_name_the_problem(sp500):
    # 30 returns need 31 closes: the first decision can be the 31st trading day.
    earliest = load_sp500_dataset().index[30].date()
    with pytest.raises(DataError, match=f"earliest possible start is {earliest}"):
        run_backtest("cash", sp500, "1990-01-01", "1990-12-31")
    with pytest.raises(ValueError, match=r"unknown baseline 'magic'.*equal-weight"):
        run_backtest("magic", sp500, "2015-01-01", "2015-12-31")
    with pytest.raises(ValueError, match="unknown asset"):
        run_backtest("cash", sp500, "2015-01-01", "2015-12-31", assets=["NOPE"])


def test_cli_backtest_writes_plot_and_reports_bad_input(tmp_path):
    runner = CliRunner()
    png = tmp_path / "bt.png"
    ok = runner.invoke(
        main,
        [
            "backtest",
            "--policy",
            "hrp",
            "--start",
            "2018-01-01",
            "--end",
            "2018-06-30",
            "--assets",
            "AAPL,MSFT,JPM",
            "--plot",
            str(png),
        ],
    )
    assert ok.exit_code == 0, ok.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "sharpe" in ok.output
    bad = runner.invoke(main, ["backtest", "--policy", "equal-weight", "--assets", "AAPL,NOPE"])
    assert bad.exit_code == 2
    assert "NOPE" in bad.output


def test_cli_accepts_a_callable_policy(tmp_path):
    """``module:callable`` policies run through the same path as baselines."""
    mod = tmp_path / "my_policy.py"
    mod.write_text(
        "import numpy as np\n"
        "def all_in_first(ctx):\n"
        "    w = np.zeros(ctx.n_slots); w[1] = 1.0\n"
        "    return w\n"
    )
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        out = tmp_path / "p.json"
        res = CliRunner().invoke(
            main,
            [
                "backtest",
                "--policy",
                "my_policy:all_in_first",
                "--assets",
                "AAPL",
                "--start",
                "2019-01-01",
                "--end",
                "2019-12-31",
                "--cost-bps",
                "0",
                "--json-out",
                str(out),
            ],
        )
    finally:
        sys.path.remove(str(tmp_path))
    assert res.exit_code == 0, res.output
    px = load_sp500_dataset()["AAPL"].loc["2019-01-01":"2019-12-31"]
    assert json.loads(out.read_text())["total_return"] == pytest.approx(
        px.iloc[-1] / px.iloc[0] - 1.0, rel=1e-12
    )
