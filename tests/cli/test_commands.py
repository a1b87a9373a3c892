"""The ``allocator`` command as a user meets it: help, data info and data check."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
from click.testing import CliRunner

from allocator.cli import main


def test_help_lists_the_subcommands():
    out = subprocess.run(
        [sys.executable, "-m", "allocator.cli", "--help"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for command in ("backtest", "data", "demo"):
        assert command in out


def test_data_info_summarizes_the_embedded_dataset():
    res = CliRunner().invoke(main, ["data", "info"])
    assert res.exit_code == 0, res.output
    assert "assets: 20" in res.output
    assert "1990-01-02" in res.output
    assert "AAPL" in res.output
    assert "XOM" in res.output


def test_data_check_accepts_good_and_names_bad_files(tmp_path):
    dates = pd.bdate_range("2021-01-01", periods=80)
    good = pd.DataFrame(
        {
            "date": list(dates) * 2,
            "asset": ["A"] * 80 + ["B"] * 80,
            "close": [100.0 + i for i in range(80)] * 2,
        }
    )
    path = tmp_path / "good.csv"
    good.to_csv(path, index=False)
    ok = CliRunner().invoke(main, ["data", "check", str(path)])
    assert ok.exit_code == 0, ok.output
    assert "2 assets, 80 dates" in ok.output

    bad = good.copy()
    bad.loc[85, "close"] = -1.0
    bad_path = tmp_path / "bad.csv"
    bad.to_csv(bad_path, index=False)
    res = CliRunner().invoke(main, ["data", "check", str(bad_path)])
    assert res.exit_code == 2
    assert str(bad_path) in res.output
    assert "row 86 (B " in res.output  # the file row (index 85 + 1) and its asset
    assert str(dates[5].date()) in res.output


def test_data_info_on_a_missing_file_exits_2(tmp_path):
    res = CliRunner().invoke(main, ["data", "info", "--dataset", str(tmp_path / "nope.csv")])
    assert res.exit_code == 2
    assert "file not found" in res.output


def test_demo_runs_baselines_then_trains_and_exports(tmp_path):
    """The README's first command, shrunk: baselines, a tiny training run, export with parity."""
    import yaml

    config = tmp_path / "tiny.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "total_timesteps": 300,
                "progress_bar": False,
                "tensorboard": False,
                "torch_threads": 1,
                "env": {"max_assets": 20, "window": 10, "episode_length": 60},
                "algorithm": {"learning_starts": 100, "batch_size": 32, "net_arch": [32, 32]},
                "data": {"validation_end": "2015-03-31"},
            }
        )
    )
    out = tmp_path / "demo"
    res = CliRunner().invoke(
        main,
        [
            "demo",
            "--out",
            str(out),
            "--start",
            "2018-01-01",
            "--end",
            "2018-12-31",
            "--config",
            str(config),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "min-variance" in res.output
    assert "exported to" in res.output
    assert "random.max_abs_action_diff" in res.output
    assert "mean daily turnover" in res.output
    assert "excess Sharpe over equal weight:" in res.output
    assert "action saturation:" in res.output
    assert "paper trading demo/1 on" in res.output
    assert "live NAV" in res.output
    assert "backtest NAV" in res.output
    for name in (
        "metrics.json",
        "equity.png",
        "allocations.png",
        "run/manifest.json",
        "models/demo/1/model.onnx",
        "models/demo/1/manifest.json",
    ):
        assert (out / name).is_file(), name
