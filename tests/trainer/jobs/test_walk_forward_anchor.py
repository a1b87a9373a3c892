"""A tilt recipe judged against its own anchor: in the run, and after it with --baseline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from allocator.cli import main
from allocator.trainer.jobs.walk_forward.rundir import WalkForwardResult, read_returns
from allocator.trainer.jobs.walk_forward.runner import run_walk_forward
from allocator.trainer.statistics.sharpe import annualized_sharpe
from allocator.typed_config import ConfigError
from tests.trainer.jobs.conftest import LocalRun
from tests.trainer.jobs.helpers import tiny

TILT = (
    "trainer.policy=shared",
    "trainer.shared.hidden=8",
    "trainer.env.features=asset_v1",
    "trainer.env.action.mapping=tilt",
    "trainer.env.action.anchor.kind=inverse_volatility",
    "record=false",
)
"""The tiny walk-forward with the default recipe's representation: a tilt of an
inverse-volatility anchor, on per-asset features, by the shared network."""


@pytest.fixture(scope="module")
def tilt_run(tmp_path_factory: pytest.TempPathFactory) -> WalkForwardResult:
    tmp = tmp_path_factory.mktemp("walk-forward-tilt")
    config = tiny(tmp, *TILT, "baselines=[equal-weight, hrp, anchor]")
    return run_walk_forward(config, progress=False)


def test_the_run_reports_the_tilt_over_its_anchor(tilt_run: WalkForwardResult) -> None:
    frame = read_returns(tilt_run.files["returns"])
    assert list(frame.columns) == ["date", "window", "agent", "equal-weight", "hrp", "anchor"]
    stats = json.loads(Path(tilt_run.files["summary"]).read_text())["summary"]["statistics"]
    assert stats["settings"]["baselines"] == ["equal-weight", "hrp", "anchor"]
    pooled = stats["pooled"]["excess_sharpe_over_anchor"]
    assert pooled["estimate"] == pytest.approx(
        annualized_sharpe(frame["agent"]) - annualized_sharpe(frame["anchor"])
    )
    assert pooled["low"] <= pooled["estimate"] <= pooled["high"]
    for span in stats["windows"]:
        part = frame[frame["window"] == span["window"]]
        assert span["excess_sharpe_over_anchor"]["benchmark_sharpe"] == pytest.approx(
            annualized_sharpe(part["anchor"])
        )
    # The anchor is a real portfolio, not the agent under another name.
    assert not np.allclose(frame["anchor"], frame["agent"])
    assert (
        "Over the anchor (the portfolio the tilt policy holds"
        in Path(tilt_run.files["report"]).read_text()
    )


def test_stats_backtests_a_missing_anchor_exactly_as_the_run_would(
    tilt_run: WalkForwardResult, tmp_path: Path
) -> None:
    """A copy of the run without its anchor column: --baseline anchor rebuilds that column
    bit for bit (same function, assets, days and costs) and leaves the copy as it was."""
    copy = tmp_path / "run"
    shutil.copytree(tilt_run.out_dir, copy)
    recorded = read_returns(copy / "returns.csv")
    recorded.drop(columns="anchor").to_csv(copy / "returns.csv", index=False)
    before = (copy / "returns.csv").read_bytes()
    out = CliRunner().invoke(
        main,
        ["walk-forward", "stats", str(copy), "--baseline", "anchor", "--json-out",
         str(tmp_path / "s.json")],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    assert "with anchor backtested now" in out.output
    assert "Over the anchor" in out.output
    assert (copy / "returns.csv").read_bytes() == before
    written = json.loads((tmp_path / "s.json").read_text())
    in_run = json.loads(Path(tilt_run.files["summary"]).read_text())["summary"]["statistics"]
    assert written["pooled"]["excess_sharpe_over_anchor"] == pytest.approx(
        in_run["pooled"]["excess_sharpe_over_anchor"]
    )
    assert written["settings"]["baselines"] == ["equal-weight", "hrp", "anchor"]


def test_stats_refuses_a_baseline_rebuilt_on_other_days(
    tilt_run: WalkForwardResult, tmp_path: Path
) -> None:
    copy = tmp_path / "run"
    shutil.copytree(tilt_run.out_dir, copy)
    recorded = read_returns(copy / "returns.csv")
    recorded.drop(columns="anchor").drop(index=5).to_csv(copy / "returns.csv", index=False)
    out = CliRunner().invoke(main, ["walk-forward", "stats", str(copy), "--baseline", "anchor"])
    assert out.exit_code == 1
    assert "anchor rebuilt on other days than the run recorded (1 day(s)" in out.output
    assert "rebuilt only" in out.output


def test_an_affine_run_has_no_anchor_to_judge_against(local_run: LocalRun) -> None:
    out = CliRunner().invoke(
        main, ["walk-forward", "stats", str(local_run.result.out_dir), "--baseline", "anchor"]
    )
    assert out.exit_code == 2
    assert "holds a tilt recipe's anchor" in out.output
    unknown = CliRunner().invoke(
        main, ["walk-forward", "stats", str(local_run.result.out_dir), "--baseline", "nope"]
    )
    assert unknown.exit_code == 2
    assert "unknown baseline 'nope'" in unknown.output


def test_an_anchor_baseline_needs_a_tilt_recipe(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="baseline 'anchor' holds the trainer's tilt anchor"):
        tiny(tmp_path, "baselines=[equal-weight, anchor]")
    assert tiny(tmp_path, *TILT, "baselines=[equal-weight, anchor]").baselines[-1] == "anchor"
