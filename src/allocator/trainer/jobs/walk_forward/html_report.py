"""The walk-forward report as one interactive page, ``report/report.html``: the test windows
stitched end to end, the excess Sharpe per window with its interval, and ``report.md``'s
statistics table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from allocator.trainer.jobs.walk_forward.report import (
    REGIME_COLORS,
    STATISTICS_HEADER,
    statistics_rows,
    stitch,
    stitched_agent,
)
from allocator.trainer.jobs.walk_forward.rundir import AGENT, WalkForwardResult, WindowResult
from allocator.trainer.jobs.walk_forward.summary import POOLED
from allocator.trainer.sim.backtest import BacktestResult
from allocator.trainer.sim.html_report import REPORT_FILE, write_backtest_report


def stitched_results(windows: list[WindowResult]) -> dict[str, BacktestResult]:
    """The model, then every baseline that ran on all windows, each over all test windows."""
    names = [n for n in windows[0].baselines if all(n in w.baselines for w in windows)]
    return {
        AGENT: stitched_agent(windows),
        **{n: stitch([w.baselines[n] for w in windows], n) for n in names},
    }


def excess_sharpe_figure(summary: dict[str, Any]) -> go.Figure:
    """Each window's excess Sharpe over equal weight with its interval, then the pooled one."""
    fig = go.Figure()
    for regime, color in REGIME_COLORS.items():
        rows = [r for r in summary["per_window"] if r["regime"] == regime]
        if not rows:
            continue
        fig.add_trace(
            go.Bar(
                x=[r["label"] for r in rows],
                y=[r["excess_sharpe"] for r in rows],
                name=regime,
                marker_color=color.removeprefix("tab:"),
                error_y=interval(rows),
            )
        )
    pooled = (summary.get("statistics") or {}).get(POOLED, {}).get("excess_sharpe")
    if pooled is not None:
        fig.add_trace(
            go.Scatter(
                x=[POOLED],
                y=[pooled["estimate"]],
                name=POOLED,
                mode="markers",
                marker={"color": "black", "size": 10},
                error_y=interval([pooled], key="estimate", low="low", high="high"),
            )
        )
    order = [r["label"] for r in summary["per_window"]] + ([POOLED] if pooled else [])
    fig.update_xaxes(categoryorder="array", categoryarray=order)
    fig.update_layout(
        title="Excess Sharpe over equal weight per test window, with its interval",
        yaxis_title="Sharpe - equal weight's",
        barmode="overlay",  # one bar per window: each regime's trace fills its own categories
        height=450,
    )
    return fig


def interval(
    rows: list[dict[str, Any]],
    key: str = "excess_sharpe",
    low: str = "excess_sharpe_low",
    high: str = "excess_sharpe_high",
) -> dict[str, Any] | None:
    """Asymmetric error bars from each row's interval; none when no row has one."""
    if all(r.get(low) is None for r in rows):
        return None
    return {
        "type": "data",
        "symmetric": False,
        "array": [None if r.get(high) is None else r[high] - r[key] for r in rows],
        "arrayminus": [None if r.get(low) is None else r[key] - r[low] for r in rows],
    }


def statistics_table(stats: dict[str, Any]) -> go.Figure:
    """The intervals and tests per window and pooled: the rows of ``report.md``'s table."""
    header = (*STATISTICS_HEADER, "deflated Sharpe")
    rows = statistics_rows(stats)
    fig = go.Figure(
        go.Table(
            header={"values": list(header), "align": "left"},
            cells={"values": [list(col) for col in zip(*rows, strict=True)], "align": "left"},
        )
    )
    fig.update_layout(title="Intervals and tests", height=120 + 28 * len(rows))
    return fig


def write_html_report(result: WalkForwardResult, folder: str | Path) -> Path | None:
    """``report.html`` in ``folder``; nothing when the run has no window to show."""
    if not result.windows:
        return None
    extra = {"excess-sharpe": excess_sharpe_figure(result.summary)}
    stats = result.summary.get("statistics")
    if stats:
        extra["statistics"] = statistics_table(stats)
    return write_backtest_report(
        Path(folder) / REPORT_FILE,
        stitched_results(result.windows),
        AGENT,
        title=f"Walk-forward: {result.config.name} ({result.label}), all test windows",
        extra=extra,
    )
