"""End-to-end runs of the shipped demo configs, shrunk to seconds: the run directory is complete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from allocator.cli import main
from allocator.recording.migrations import upgrade
from allocator.recording.schema import TrainingRun as TrainingRunRow
from allocator.trainer.training.config import load_config
from tests.plotly_html import check_html, figures_in, traces, values

ROOT = Path(__file__).resolve().parents[3]
TINY = [
    "total_timesteps=360",
    "env.episode_length=60",
    "algorithm.learning_starts=100",
    "algorithm.batch_size=32",
    "algorithm.net_arch=[32,32]",
    "data.validation_end=2015-06-30",
    "progress_bar=false",
    "torch_threads=1",
]
COMMON_FILES = (
    "model.zip",
    "config.yaml",
    "normalization.json",
    "state_scale_summary.json",
    "action_saturation.json",
    "validation.json",
    "validation.png",
    "validation_allocations.png",
    "report.html",
    "training_curves.png",
    "progress.csv",
    "run.json",
)


def run_cli(
    config: str, run_dir: Path, extra: list[str] | None = None, database_url: str | None = None
) -> str:
    args = ["train", "--config", str(ROOT / "configs" / config), "--run-dir", str(run_dir)]
    if database_url is not None:
        args += ["--database-url", database_url]
    for item in TINY + (extra or []):
        args += ["--set", item]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return result.output


def scalar_tags(run_dir: Path) -> set[str]:
    events = list(run_dir.glob("events.out.tfevents.*"))
    assert events, "no TensorBoard event file"
    acc = EventAccumulator(str(events[0]))
    acc.Reload()
    return set(acc.Tags()["scalars"])


def test_td3_demo_config_leaves_a_complete_run_directory(tmp_path):
    run_dir = tmp_path / "td3"
    out = run_cli("td3_demo.yaml", run_dir, ["tensorboard=true"])
    assert "equal-weight" in out
    for name in COMMON_FILES:
        assert (run_dir / name).is_file(), name
    tags = scalar_tags(run_dir)
    for tag in (
        "train/actor_loss",
        "train/critic_loss",
        "train/smooth_lambda",
        "train/smooth_penalty",
        "rollout/turnover",
    ):
        assert tag in tags, tag
    validation = json.loads((run_dir / "validation.json").read_text())
    assert set(validation["metrics"]) == {"td3", "equal-weight", "hrp"}
    excess = validation["excess_sharpe_vs_equal_weight"]
    assert excess["estimate"] == pytest.approx(
        validation["metrics"]["td3"]["sharpe"] - validation["metrics"]["equal-weight"]["sharpe"],
        abs=0.05,  # the metrics' Sharpe and the bootstrap's share days but not every convention
    )
    assert excess["low"] <= excess["estimate"] <= excess["high"]
    allocation = validation["allocation"]
    assert list(allocation["weights"]) == ["cash", *validation["assets"]]
    for w in allocation["weights"].values():
        assert 0.0 <= w["min"] <= w["mean"] <= w["max"] <= 1.0
    assert allocation["mean_daily_turnover"] == pytest.approx(
        validation["metrics"]["td3"]["turnover"], rel=1e-6
    )
    saturation = json.loads((run_dir / "action_saturation.json").read_text())
    assert 0.0 <= saturation["near_bound_ratio"] <= 1.0
    # The interactive report draws the validation's own backtests: every policy's NAV ends at
    # its total return, the agent's turnover averages to its metric, its weights are its range.
    assert f"interactive report: {run_dir / 'report.html'}" in out
    check_html((run_dir / "report.html").read_text(encoding="utf-8"))
    figures = figures_in(run_dir / "report.html")
    navs = traces(figures["performance"], "y")
    assert list(navs) == list(validation["metrics"])
    for name, nav in navs.items():
        y = values(nav["y"])
        assert y[-1] / y[0] - 1 == pytest.approx(validation["metrics"][name]["total_return"])
    turnover = values(traces(figures["performance"], "y3")["td3"]["y"])
    assert turnover.mean() == pytest.approx(allocation["mean_daily_turnover"], rel=1e-12)
    for asset, area in traces(figures["allocations"], "y2").items():
        w = values(area["y"])
        held = allocation["weights"][asset]
        assert (w.min(), w.max()) == pytest.approx((held["min"], held["max"]), abs=1e-12)
    host = json.loads((run_dir / "run.json").read_text())["host"]
    assert host["torch_threads"] == 1  # the run's own setting, read back from torch
    assert host["cpu"]
    assert host["cpu_capability"] in {"DEFAULT", "AVX2", "AVX512", "ZVECTOR", "VSX"}
    # The resolved config reproduces the run's settings.
    resolved = load_config(run_dir / "config.yaml")
    assert resolved.total_timesteps == 360
    assert resolved.algorithm.smoothness.mode == "adaptive"


def test_sac_icm_demo_config_saves_the_curiosity_module(tmp_path):
    run_dir = tmp_path / "sac"
    run_cli("sac_icm_demo.yaml", run_dir, ["icm.warmup_steps=100", "tensorboard=true"])
    for name in (*COMMON_FILES, "icm.pt"):
        assert (run_dir / name).is_file(), name
    tags = scalar_tags(run_dir)
    for tag in (
        "train/actor_loss",
        "train/critic_loss",
        "icm/forward_loss",
        "icm/inverse_loss",
        "icm/intrinsic_reward_mean",
        "rollout/turnover",
    ):
        assert tag in tags, tag


@pytest.mark.parametrize(
    "config",
    [
        "td3_demo.yaml",
        "sac_icm_demo.yaml",
        "td3.yaml",
        "sac_icm.yaml",
        "td3_shared_demo.yaml",
        "sac_icm_shared_demo.yaml",
    ],
)
def test_shipped_configs_validate(config):
    cfg = load_config(ROOT / "configs" / config)
    assert cfg.data.dataset == "sp500"


def test_bad_config_key_exits_2_naming_it(tmp_path):
    res = CliRunner().invoke(main, ["train", "--set", "env.betta=0.3", "--run-dir", str(tmp_path)])
    assert res.exit_code == 2
    assert "env.betta" in res.output


def test_a_finished_run_is_recorded_in_training_runs(tmp_path):
    url = f"sqlite:///{tmp_path / 'trade.db'}"
    run_dir = tmp_path / "recorded"
    refused = CliRunner().invoke(main, ["train", "--run-dir", str(run_dir), "--database-url", url])
    assert refused.exit_code == 2
    assert "no training_runs table" in refused.output
    assert not run_dir.exists()  # refused before training
    upgrade(url)
    out = run_cli("td3_demo.yaml", run_dir, database_url=url)
    assert "recorded as training run 1" in out
    engine = create_engine(url)
    with Session(engine) as session:
        (row,) = session.scalars(select(TrainingRunRow)).all()
    engine.dispose()
    summary = json.loads((run_dir / "run.json").read_text())
    assert row.name == run_dir.name
    assert row.run_dir == str(run_dir)
    assert row.algorithm == summary["algorithm"]
    assert row.config["total_timesteps"] == 360
    assert row.metrics["validation"] == summary["validation"]
    assert row.finished is not None
    assert row.started <= row.finished
    assert not list(run_dir.glob("events.out.tfevents.*"))  # TensorBoard only when asked for
