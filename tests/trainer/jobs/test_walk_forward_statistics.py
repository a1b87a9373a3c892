"""Walk-forward statistics: the kept daily returns, intervals and tests, the stats command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from allocator.cli import main
from allocator.trainer.jobs.walk_forward.config import WalkForwardConfig
from allocator.trainer.jobs.walk_forward.report import format_statistics
from allocator.trainer.jobs.walk_forward.rundir import read_returns
from allocator.trainer.jobs.walk_forward.summary import run_statistics
from allocator.trainer.market.windows import WindowSpec
from allocator.trainer.statistics.sharpe import annualized_sharpe
from tests.trainer.jobs.conftest import LocalRun
from tests.trainer.jobs.helpers import (
    TINY,
    as_json,
    rows,
)

# --- daily returns, intervals and tests ----------------------------------------------------

SUMMARY_KEYS_BEFORE_STATISTICS = {
    "name", "label", "run_id", "executor", "seconds", "model_name", "registry", "cost_bps",
    "baseline_fit", "windows_spec", "summary", "windows",
}  # fmt: skip
"""summary.json's keys before the statistics: readers of older runs rely on every one."""


def test_the_run_keeps_every_windows_daily_returns(local_run: LocalRun) -> None:
    result = local_run.result
    path = Path(result.files["returns"])
    assert path == result.out_dir / "returns.csv"
    frame = read_returns(path)
    policies = ["agent", "equal-weight", "buy-and-hold", "min-variance", "hrp"]
    assert list(frame.columns) == ["date", "window", *policies]
    assert list(frame["window"].unique()) == ["w00", "w01"]
    for w in result.windows:
        part = frame[frame["window"] == w.window.label]
        assert list(part["date"]) == list(w.agent.returns.index)
        np.testing.assert_array_equal(part["agent"], w.agent.returns.to_numpy())
        for name, baseline in w.baselines.items():
            assert list(baseline.returns.index) == list(w.agent.returns.index)
            np.testing.assert_array_equal(part[name], baseline.returns.to_numpy())


def test_the_summary_gives_intervals_and_tests(local_run: LocalRun) -> None:
    result = local_run.result
    payload = json.loads(Path(result.files["summary"]).read_text())
    assert payload.keys() >= SUMMARY_KEYS_BEFORE_STATISTICS
    assert payload["configurations_tried"] == 1
    assert payload["baseline_rebalance_every"] == 21
    stats = payload["summary"]["statistics"]
    assert stats["settings"]["configurations_tried"] == 1
    assert stats["settings"]["baselines"] == ["equal-weight", "buy-and-hold", "min-variance", "hrp"]
    assert (stats["settings"]["reps"], stats["settings"]["interval"]) == (1000, "percentile")
    frame = read_returns(result.files["returns"])
    for row, span in zip(payload["windows"], stats["windows"], strict=True):
        assert span["window"] == row["label"]
        ex = span["excess_sharpe"]
        # The bootstrap's statistic is the backtest's Sharpe, so its estimate is the row's.
        assert ex["estimate"] == pytest.approx(row["excess_sharpe"], rel=1e-9, abs=1e-12)
        assert (row["excess_sharpe_low"], row["excess_sharpe_high"]) == (ex["low"], ex["high"])
        assert ex["low"] <= ex["estimate"] <= ex["high"]
        assert row["spa_pvalue"] == span["spa"]["pvalues"]["consistent"]
        assert 0 <= row["spa_pvalue"] <= 1
        assert row["deflated_sharpe"] == span["deflated_sharpe"]["deflated"]
        assert span["deflated_sharpe"]["sharpe"] == pytest.approx(row["sharpe"])
    pooled = stats["pooled"]
    assert pooled["days"] == len(frame)
    assert pooled["excess_sharpe"]["estimate"] == pytest.approx(
        annualized_sharpe(frame["agent"]) - annualized_sharpe(frame["equal-weight"])
    )
    assert 0 <= pooled["deflated_sharpe"]["deflated"] <= 1
    report = Path(result.files["report"]).read_text()
    assert "## Intervals and tests" in report
    assert f"| pooled | {len(frame)} |" in report
    # The pooled figures reach the database with the run's summary.
    (run,) = rows(local_run.url, "SELECT summary FROM walk_forward_runs")
    assert as_json(run["summary"])["statistics"]["pooled"]["days"] == len(frame)


def test_stats_cli_recomputes_the_runs_statistics(local_run: LocalRun, tmp_path: Path) -> None:
    result = local_run.result
    summary = json.loads(Path(result.files["summary"]).read_text())["summary"]
    out = CliRunner().invoke(
        main, ["walk-forward", "stats", str(result.out_dir), "--json-out", str(tmp_path / "s.json")]
    )
    assert out.exit_code == 0, out.output
    assert f"daily returns: {result.files['returns']}" in out.output
    assert out.output.count("pooled") >= 2  # the table's line and the note
    assert format_statistics(summary["statistics"]) in out.output
    written = json.loads((tmp_path / "s.json").read_text())
    assert written["pooled"] == summary["statistics"]["pooled"]
    assert written["windows"] == summary["statistics"]["windows"]

    many = CliRunner().invoke(
        main,
        ["walk-forward", "stats", str(result.out_dir), "--configurations-tried", "50", "--json-out",
         str(tmp_path / "many.json")],
    )  # fmt: skip
    assert many.exit_code == 0, many.output
    deflated = json.loads((tmp_path / "many.json").read_text())["pooled"]["deflated_sharpe"]
    assert deflated["trials"] == 50
    assert deflated["deflated"] < summary["statistics"]["pooled"]["deflated_sharpe"]["deflated"]
    assert deflated["sharpe"] == summary["statistics"]["pooled"]["deflated_sharpe"]["sharpe"]


def test_stats_cli_refuses_a_run_without_returns_csv(local_run: LocalRun, tmp_path: Path) -> None:
    """The statistics read the kept daily returns only: without them there is nothing to judge."""
    partial = tmp_path / "partial-run"
    partial.mkdir()
    (partial / "summary.json").write_text(Path(local_run.result.files["summary"]).read_text())
    out = CliRunner().invoke(main, ["walk-forward", "stats", str(partial)])
    assert out.exit_code == 2
    assert "has no returns.csv: not a finished walk-forward run" in out.output


def test_stats_cli_refuses_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    out = CliRunner().invoke(main, ["walk-forward", "stats", str(tmp_path)])
    assert out.exit_code == 2
    assert "has no summary.json: not a finished walk-forward run" in out.output


def test_walk_forward_without_config_or_command_is_refused() -> None:
    out = CliRunner().invoke(main, ["walk-forward"])
    assert out.exit_code == 2
    assert "Missing option '--config'" in out.output
    both = CliRunner().invoke(main, ["walk-forward", "--config", str(TINY), "stats", "."])
    assert both.exit_code == 2
    assert "run a walk-forward, not 'stats'" in both.output


def test_a_window_too_short_for_statistics_says_so() -> None:
    rng = np.random.default_rng(0)
    days = pd.bdate_range("2020-01-01", periods=65)
    frame = pd.DataFrame(
        {
            "date": days,
            "window": ["w00"] * 60 + ["w01"] * 5,
            "agent": rng.normal(0.001, 0.01, 65),
            "equal-weight": rng.normal(0.0, 0.01, 65),
            "hrp": rng.normal(0.0, 0.01, 65),
        }
    )
    config = WalkForwardConfig(windows=WindowSpec(start="2016-01-01", end="2022-12-31"))
    stats = run_statistics(frame, config.statistics, 3)
    first, short = stats["windows"]
    assert first["days"] == 60
    assert first["deflated_sharpe"]["trials"] == 3
    assert short == {"window": "w01", "days": 5, "error": short["error"]}
    assert short["error"] == "policy has 5 daily returns; at least 20 are needed"
    assert stats["pooled"]["days"] == 65
    text = format_statistics(stats)
    assert "w01: no statistics:" in text
    assert "n/a" in text
