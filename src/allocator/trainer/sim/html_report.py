"""One self-contained ``report.html`` of plotly figures; plotly.js is embedded, not linked from
a CDN, so a report opened offline from archives still draws years later."""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from allocator.artifacts.files import atomic_write_text
from allocator.trainer.sim.backtest import BacktestResult
from allocator.trainer.sim.plots import drawdown, held_columns

REPORT_FILE = "report.html"
PANELS = ("NAV (net of costs)", "drawdown", "daily turnover")
PALETTE = ("black", *qualitative.D3)  # the first policy (the agent) in black
ASSET_COLORS = qualitative.Dark24


def add_line(fig: go.Figure, row: int, name: str, values: pd.Series, **style: Any) -> None:
    """One named series in subplot ``row``, its legend entry shown once (in the first row)."""
    trace = go.Scatter(
        x=values.index, y=values.to_numpy(), name=name, legendgroup=name, showlegend=row == 1
    )
    fig.add_trace(trace.update(**style), row=row, col=1)


def performance_figure(results: Mapping[str, BacktestResult]) -> go.Figure:
    """NAV, drawdown and daily turnover of every policy on a shared date axis, the first bold."""
    fig = make_subplots(
        rows=3, cols=1, shared_xaxes=True, subplot_titles=PANELS, vertical_spacing=0.07
    )
    for k, (name, res) in enumerate(results.items()):
        line = {"color": PALETTE[k % len(PALETTE)], "width": 1.8 if k == 0 else 1.1}
        series = (res.nav, drawdown(res.nav), res.turnover)
        for row, values in enumerate(series, start=1):
            add_line(fig, row, name, values, line=line)
    fig.update_yaxes(tickformat=".0%", row=2, col=1)
    fig.update_layout(title="Equity, drawdown and turnover", height=800, hovermode="x unified")
    return fig


def allocation_figure(result: BacktestResult) -> go.Figure:
    """The raw and executed weights as stacked areas, slots never held left out."""
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        subplot_titles=("raw weights", "executed (smoothed) weights"),
        vertical_spacing=0.08,
    )
    frames = (result.raw_weights, result.executed_weights)
    columns = list(held_columns(pd.concat(frames)).columns)
    for row, (group, frame) in enumerate(zip(("raw", "executed"), frames, strict=True), start=1):
        for k, asset in enumerate(columns):
            color = ASSET_COLORS[k % len(ASSET_COLORS)]
            style = {"stackgroup": group, "mode": "lines", "line": {"width": 0, "color": color}}
            add_line(fig, row, str(asset), frame[asset], **style)
    fig.update_yaxes(range=[0, 1], tickformat=".0%")
    fig.update_layout(title=f"{result.name}: allocations", height=650, hovermode="x unified")
    return fig


def write_backtest_report(
    path: str | Path,
    results: Mapping[str, BacktestResult],
    agent: str,
    *,
    title: str | None = None,
    extra: Mapping[str, go.Figure] | None = None,
) -> Path:
    """Every result's curves (``agent``'s first), ``agent``'s allocations, then ``extra``."""
    if agent not in results:
        raise ValueError(f"agent {agent!r} is not among the results ({', '.join(results)})")
    nav = results[agent].nav
    heading = title or f"{agent}: {nav.index[0].date()} .. {nav.index[-1].date()}"
    ordered = {agent: results[agent], **{k: v for k, v in results.items() if k != agent}}
    figures = {
        "performance": performance_figure(ordered),
        "allocations": allocation_figure(results[agent]),
        **(extra or {}),
    }
    divs = [  # each figure in a div named by its id; plotly.js once, with the first
        pio.to_html(fig, include_plotlyjs=k == 0, full_html=False, div_id=div_id)
        for k, (div_id, fig) in enumerate(figures.items())
    ]
    text = "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            f'<head><meta charset="utf-8"><title>{html.escape(heading)}</title></head>',
            '<body style="font-family: sans-serif; margin: 1em 2em">',
            f"<h1>{html.escape(heading)}</h1>",
            *divs,
            "</body>",
            "</html>",
        ]
    )
    return atomic_write_text(path, text + "\n")
