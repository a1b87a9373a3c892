"""The walk-forward's interactive report: its figures carry the run's windows and statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from allocator.trainer.jobs.walk_forward.config import WalkForwardConfig
from allocator.trainer.jobs.walk_forward.report import statistics_rows, write_html_report
from allocator.trainer.jobs.walk_forward.rundir import WalkForwardResult
from allocator.trainer.market.windows import WindowSpec
from tests.plotly_html import check_html, figures_in, traces, values
from tests.trainer.jobs.conftest import LocalRun


def test_the_run_writes_report_html_beside_report_md(local_run: LocalRun) -> None:
    result = local_run.result
    path = Path(result.files["html"])
    assert path == result.out_dir / "report" / "report.html"
    assert Path(result.files["report"]).parent == path.parent
    check_html(path.read_text(encoding="utf-8"))
    assert list(result.out_dir.rglob("report.html")) == [path]  # one report, not one a window
    figures = figures_in(path)
    assert list(figures) == ["performance", "allocations", "excess-sharpe", "statistics"]

    # NAV over all test windows: each window's curve continues where the previous one ended
    navs = traces(figures["performance"], "y")
    assert list(navs) == ["agent", *result.windows[0].baselines]
    for name, trace in navs.items():
        nav = values(trace["y"])
        parts = [w.agent if name == "agent" else w.baselines[name] for w in result.windows]
        growth = np.prod([p.nav.iloc[-1] / p.nav.iloc[0] for p in parts])
        assert nav[0] == 1.0
        assert nav[-1] == pytest.approx(growth, rel=1e-12)
        assert len(nav) == 1 + sum(len(p.nav) - 1 for p in parts)
    turnover = values(traces(figures["performance"], "y3")["agent"]["y"])
    expected = np.concatenate([w.agent.turnover.to_numpy() for w in result.windows])
    np.testing.assert_array_equal(turnover, expected)

    # each window's excess Sharpe with the interval the summary holds, then the pooled one
    rows = {r["label"]: r for r in result.summary["per_window"]}
    bars = [t for t in figures["excess-sharpe"]["data"] if t["type"] == "bar"]
    assert {t["name"] for t in bars} == {r["regime"] for r in rows.values()}
    shown = 0
    for bar in bars:
        for label, y, up, down in zip(
            values(bar["x"]),
            values(bar["y"]),
            values(bar["error_y"]["array"]),
            values(bar["error_y"]["arrayminus"]),
            strict=True,
        ):
            row = rows[str(label)]
            assert bar["name"] == row["regime"]
            assert y == row["excess_sharpe"]
            assert y + up == pytest.approx(row["excess_sharpe_high"], abs=1e-12)
            assert y - down == pytest.approx(row["excess_sharpe_low"], abs=1e-12)
            shown += 1
    assert shown == len(rows)
    (pooled,) = [t for t in figures["excess-sharpe"]["data"] if t["name"] == "pooled"]
    stats = result.summary["statistics"]
    assert values(pooled["y"])[0] == stats["pooled"]["excess_sharpe"]["estimate"]

    # the statistics table is report.md's, cell for cell
    cells = figures["statistics"]["data"][0]["cells"]["values"]
    assert [list(row) for row in zip(*cells, strict=True)] == [
        list(r) for r in statistics_rows(stats)
    ]


def test_a_run_without_windows_writes_no_page(tmp_path: Path) -> None:
    config = WalkForwardConfig(windows=WindowSpec(start="2016-01-01", end="2022-12-31"))
    result = WalkForwardResult("L", config, tmp_path, [], {"per_window": []})
    assert write_html_report(result, tmp_path) is None
    assert not (tmp_path / "report.html").exists()
