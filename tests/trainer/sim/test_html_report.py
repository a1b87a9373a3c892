"""The interactive backtest report: one offline page whose figures carry the run's own numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from allocator.trainer.market.data import MarketData, load_sp500
from allocator.trainer.sim.backtest import BacktestResult, run_backtest
from allocator.trainer.sim.html_report import write_backtest_report
from allocator.trainer.sim.plots import drawdown
from tests.plotly_html import check_html, figures_in, traces, values


@pytest.fixture(scope="module")
def results() -> dict[str, BacktestResult]:
    data: MarketData = load_sp500().select(["AAPL", "JPM", "XOM", "MSFT"])
    span = ("2016-01-01", "2016-06-30")
    return {
        "min-variance": run_backtest("min-variance", data, *span, beta=0.5),
        "equal-weight": run_backtest("equal-weight", data, *span),
        "cash": run_backtest("cash", data, *span),
    }


def test_the_page_holds_every_curve_with_the_backtests_numbers(tmp_path, results):
    path = write_backtest_report(tmp_path / "report.html", results, "min-variance")
    text = path.read_text(encoding="utf-8")
    tags = check_html(text)
    assert tags[:4] == ["html", "head", "meta", "title"]
    assert "min-variance: 2016-01-04 .. 2016-06-30" in text
    assert text.count("plotly.js v") == 1  # inlined once, however many figures

    figures = figures_in(path)
    assert list(figures) == ["performance", "allocations"]
    perf = figures["performance"]
    for axis, series in (("y", "nav"), ("y2", "drawdown"), ("y3", "turnover")):
        on_axis = traces(perf, axis)
        assert list(on_axis) == list(results), axis
        for name, res in results.items():
            expected = {
                "nav": res.nav,
                "drawdown": drawdown(res.nav),
                "turnover": res.turnover,
            }[series]
            np.testing.assert_array_equal(values(on_axis[name]["y"]), expected.to_numpy())
    assert values(traces(perf, "y2")["cash"]["y"]).max() == 0.0  # cash never falls

    agent = results["min-variance"]
    raw, executed = traces(figures["allocations"], "y"), traces(figures["allocations"], "y2")
    held = [c for c in agent.executed_weights if (agent.raw_weights[c] > 1e-12).any()]
    assert set(raw) == set(executed) == set(held)
    assert "CASH" not in held  # min-variance of four stocks holds no cash: no empty band
    for asset in held:
        assert raw[asset]["stackgroup"] == "raw"
        np.testing.assert_array_equal(values(raw[asset]["y"]), agent.raw_weights[asset])
        np.testing.assert_array_equal(values(executed[asset]["y"]), agent.executed_weights[asset])


def test_an_agent_missing_from_the_results_is_named(tmp_path, results):
    with pytest.raises(ValueError, match="agent 'td3' is not among the results"):
        write_backtest_report(tmp_path / "report.html", results, "td3")
    assert not (tmp_path / "report.html").exists()


def test_extra_figures_follow_in_order(tmp_path: Path, results):
    import plotly.graph_objects as go

    extra = {"b": go.Figure(go.Bar(x=["w00"], y=[0.25], name="one")), "a": go.Figure()}
    path = write_backtest_report(
        tmp_path / "r.html", results, "cash", title="A <title>", extra=extra
    )
    assert "<h1>A &lt;title&gt;</h1>" in path.read_text(encoding="utf-8")
    figures = figures_in(path)
    assert list(figures) == ["performance", "allocations", "b", "a"]
    navs = traces(figures["performance"], "y")
    assert list(navs) == ["cash", "min-variance", "equal-weight"]  # the agent leads, in black
    assert navs["cash"]["line"]["color"] == "black"
    assert values(figures["b"]["data"][0]["y"]).tolist() == [0.25]
