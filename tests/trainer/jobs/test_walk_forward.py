"""Walk-forward end to end on the tiny config: train -> export -> serving-path backtest per
window, rows in SQLite and Postgres, summary and report, Pushgateway, local vs Ray."""

from __future__ import annotations

import dataclasses
import json
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from allocator.cli import main
from allocator.trainer.jobs.evaluation import evaluate_baselines
from allocator.trainer.jobs.walk_forward.config import (
    Goals,
    RegimeThresholds,
    WalkForwardConfig,
    WalkForwardError,
    load_walk_forward_config,
)
from allocator.trainer.jobs.walk_forward.report import format_summary, write_report
from allocator.trainer.jobs.walk_forward.rundir import WalkForwardResult, WindowResult
from allocator.trainer.jobs.walk_forward.runner import run_walk_forward
from allocator.trainer.jobs.walk_forward.summary import summarize
from allocator.trainer.jobs.walk_forward.window import plan
from allocator.trainer.market.data import load_sp500
from allocator.trainer.market.windows import Window, WindowSpec
from allocator.trainer.sim.backtest import run_backtest
from allocator.typed_config import ConfigError
from tests.trainer.jobs.conftest import LocalRun
from tests.trainer.jobs.helpers import (
    CONFIGS,
    TINY,
    as_json,
    free_address,
    migrated_sqlite,
    remigrate,
    rows,
    tiny,
)

FULL = CONFIGS / "walk_forward.yaml"
DEV = CONFIGS / "walk_forward_dev.yaml"


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def postgres_url(postgres_database: str) -> str:
    """A fresh Postgres database for this module, migrated (dropped at the end)."""
    return remigrate(postgres_database)


# --- configuration -------------------------------------------------------------------------


def test_the_shipped_config_plans_the_issue_walk_forward(tmp_path: Path) -> None:
    """2005-2022, rolling 5-year training, 1-year tests: 13 windows of the default recipe
    (td3_shared_demo.yaml), its deflated Sharpe discounting the 9 recipes run on those years,
    itself included."""
    config = load_walk_forward_config(FULL, [f"registry={tmp_path / 'models'}"])
    assert config.trainer_source == str(FULL.parent / "td3_shared_demo.yaml")
    assert config.trainer.algorithm.name == "td3"
    assert config.trainer.algorithm.smoothness.mode == "adaptive"
    assert config.trainer.policy == "shared"
    assert config.trainer.selection.enabled
    assert config.trainer.env.action.anchor.kind == "equal"
    assert config.cost_bps == 10
    assert config.configurations_tried == 10  # RESULTS.md: every recipe tried on 2010-2022
    assert config.trainer.selection.fallback_level == 0.8
    assert config.baselines == ["equal-weight", "buy-and-hold", "min-variance", "hrp", "anchor"]
    jobs = plan(config, tmp_path / "out", "L")
    assert [j.window.test_start.year for j in jobs] == list(range(2010, 2023))
    for k, job in enumerate(jobs):
        w, d = job.window, job.trainer.data
        assert (d.train_start, d.train_end) == (w.train_start, w.train_end)
        assert (d.validation_start, d.validation_end) == (w.test_start, w.test_end)
        assert job.trainer.seed == k  # seed 0 + window index
        assert job.trainer.torch_threads == 1
        assert not job.trainer.progress_bar
        assert job.version == f"wf-L-w{k:02d}"
        assert Path(job.registry).is_absolute()
        assert Path(job.run_dir).is_relative_to(tmp_path / "out")
    # The trainer swaps and its keys are overridable like any other key.
    sac = load_walk_forward_config(
        FULL,
        ["trainer=sac_icm.yaml", "trainer.total_timesteps=500", "seed=7",
         "baselines=[equal-weight,buy-and-hold,min-variance,hrp]"],
    )  # fmt: skip
    assert sac.trainer.algorithm.name == "sac"
    assert sac.trainer.icm.enabled
    assert sac.trainer.total_timesteps == 500
    assert plan(sac, tmp_path / "o", "L")[2].trainer.seed == 9


def test_the_development_config_tests_only_years_before_the_walk_forward(tmp_path: Path) -> None:
    """The development walk-forward runs the same recipe and windows five years earlier: its
    test years (2005-2009) and the training they need end before 2010's test year starts."""
    dev = load_walk_forward_config(DEV, [f"registry={tmp_path / 'models'}"])
    full = load_walk_forward_config(FULL, [f"registry={tmp_path / 'models'}"])
    assert dev.trainer_source == full.trainer_source
    assert dev.trainer == full.trainer
    assert (dev.cost_bps, dev.baselines) == (full.cost_bps, full.baselines)
    dev_jobs = plan(dev, tmp_path / "dev", "L")
    full_jobs = plan(full, tmp_path / "full", "L")
    assert [j.window.test_start.year for j in dev_jobs] == list(range(2005, 2010))
    assert max(j.window.test_end for j in dev_jobs) < min(j.window.test_start for j in full_jobs)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("windows.purge_days=-1", "windows.purge_days"),
        ("trainer.algorithm.gamma=2", "trainer.algorithm.gamma"),
        ("baselines=[equal-weight,magic]", "unknown baseline"),
        ("baselines=[hrp]", "equal-weight is required"),
        ("trainer=td3.yaml", r"drop it \(--set 'baselines=\[equal-weight,buy-and-hold,"),
        ("executor=spark", "executor"),
        ("trainer=nowhere.yaml", "trainer config 'nowhere.yaml' not found"),
        ("windows.freq=fortnightly", "not a pandas offset alias"),
        ("configurations_tried=0", "configurations_tried"),
        ("statistics.interval=basic", "statistics.interval"),
        ("statistics.level=1.5", "statistics.level"),
    ],
)
def test_bad_configs_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_walk_forward_config(FULL, [override])


# --- end to end ----------------------------------------------------------------------------


def test_local_run_trains_exports_evaluates_and_records(local_run: LocalRun) -> None:
    result, url = local_run.result, local_run.url
    label = result.label
    assert [w.window.index for w in result.windows] == [0, 1]
    registry = Path(result.config.registry)
    for w in result.windows:
        assert w.version == f"wf-{label}-{w.window.label}"
        assert (registry / "allocator-wf-tiny" / w.version / "model.onnx").is_file()
        assert w.agent.settings["version"] == w.version
        assert w.agent.settings["assets"] == ["AAPL", "MSFT", "JPM", "XOM"]
        assert w.agent.nav.index[0].date() == w.window.test_start
        assert w.agent.nav.index[-1].date() == w.window.test_end
        assert w.manifest["data"]["train_end"] == str(w.window.train_end)
        assert set(w.baselines) == {"equal-weight", "buy-and-hold", "min-variance", "hrp"}
        assert w.icm is None

    (run,) = rows(url, "SELECT * FROM walk_forward_runs")
    assert run["id"] == result.run_id
    assert run["name"] == f"wf_tiny-{label}"
    assert run["finished"] is not None
    summary = as_json(run["summary"])
    assert summary["windows"] == 2
    assert summary["positive_sharpe"] == result.summary["positive_sharpe"]
    assert as_json(run["config"])["windows"]["freq"] == "QS"

    windows = rows(url, 'SELECT * FROM walk_forward_windows ORDER BY "index"')
    versions = {r["id"]: r for r in rows(url, "SELECT * FROM model_versions")}
    assert len(windows) == 2
    for row, w in zip(windows, result.windows, strict=True):
        assert row["run_id"] == result.run_id
        assert str(row["train_start"]) == str(w.window.train_start)
        assert str(row["test_end"]) == str(w.window.test_end)
        metrics = as_json(row["metrics"])
        assert metrics["sharpe"] == pytest.approx(w.metrics()["sharpe"])
        assert metrics["version"] == w.version
        assert metrics["regime"] in {"bull", "bear", "sideways"}
        baselines = as_json(row["baseline_metrics"])
        assert baselines["hrp"]["sharpe"] == pytest.approx(w.baseline_metrics()["hrp"]["sharpe"])
        version = versions[row["model_version_id"]]
        assert (version["name"], version["version"]) == ("allocator-wf-tiny", w.version)
        assert version["algorithm"] == "td3"
        assert as_json(version["manifest"])["export"]["registry_version"] == w.version
        assert row["icm_stats"] is None

    # The summary's fractions are those of the recorded rows.
    recorded = [as_json(r["metrics"]) for r in windows]
    ew = [as_json(r["baseline_metrics"])["equal-weight"]["sharpe"] for r in windows]
    assert summary["positive_sharpe"] == np.mean([m["sharpe"] > 0 for m in recorded])
    assert summary["beats_equal_weight"] == np.mean(
        [m["sharpe"] > e for m, e in zip(recorded, ew, strict=True)]
    )
    assert summary["median_excess_sharpe"] == pytest.approx(
        np.median([m["sharpe"] - e for m, e in zip(recorded, ew, strict=True)])
    )
    assert summary["mean_turnover"] == pytest.approx(np.mean([m["turnover"] for m in recorded]))


def test_summary_json_and_report_folder(local_run: LocalRun) -> None:
    result = local_run.result
    payload = json.loads(Path(result.files["summary"]).read_text())
    assert payload["label"] == result.label
    assert [w["version"] for w in payload["windows"]] == [w.version for w in result.windows]
    assert payload["summary"]["by_regime"].keys() == {"bull", "bear", "sideways"}
    report = Path(result.files["report"]).read_text()
    assert "| w01 |" in report
    assert "beats equal weight" in report
    for name in ("equity", "excess_sharpe", "allocations"):
        png = Path(result.files[name])
        assert png.parent == result.out_dir / "report"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png.name})" in report


def test_window_figures_reach_the_pushgateway(local_run: LocalRun) -> None:
    if local_run.gateway is None:
        pytest.skip("prometheus-pushgateway is not installed")
    assert local_run.result.push_error is None
    with urllib.request.urlopen(f"{local_run.gateway}/metrics", timeout=5) as resp:
        families = text_string_to_metric_families(resp.read().decode())
    samples = [s for f in families for s in f.samples]
    group = {"job": "allocator_walk_forward", "model": "allocator-wf-tiny"}

    def value(name: str, **labels: str) -> float:
        want = {**group, **labels}.items()
        (sample,) = [s for s in samples if s.name == name and want <= s.labels.items()]
        return sample.value

    for w in local_run.result.windows:
        sharpe = value("allocator_jobs_window_sharpe", window=w.window.label)
        assert sharpe == pytest.approx(w.metrics()["sharpe"])
        watch = json.loads((Path(w.run_dir) / "run.json").read_text())["saturation_watch"]
        near = value("allocator_jobs_window_action_near_bound_ratio", window=w.window.label)
        assert near == pytest.approx(watch["last"]["near_bound_ratio"])
        collapsed = value("allocator_jobs_window_actor_collapsed", window=w.window.label)
        assert collapsed == float(watch["collapsed"])
    assert value("allocator_jobs_windows_total") == 2
    assert value("allocator_jobs_last_success_timestamp_seconds") > 0
    assert value("allocator_jobs_duration_seconds_count") == 1


def test_postgres_cli_run_with_curiosity_keeps_rows_when_the_push_fails(
    tmp_path: Path, postgres_url: str
) -> None:
    """TD3 + ICM through ``allocator walk-forward``; the gateway is down: exit 1, rows kept."""
    dead = f"http://{free_address()}"
    out = CliRunner().invoke(
        main,
        [
            "walk-forward",
            "--config",
            str(TINY),
            "--set",
            f"registry={tmp_path / 'models'}",
            "--set",
            f"database_url={postgres_url}",
            "--set",
            f"pushgateway_url={dead}",
            "--set",
            "trainer.icm.enabled=true",
            "--set",
            "trainer.icm.warmup_steps=100",
            "--out",
            str(tmp_path / "wf"),
            "--no-progress",
        ],
    )
    assert out.exit_code == 1, out.output
    assert (
        f"error: could not push metrics of job 'allocator_walk_forward' to the Pushgateway at "
        f"{dead}" in out.output
    )
    assert "2 windows in" in out.output
    assert (tmp_path / "wf" / "summary.json").is_file()
    assert f"html:    {tmp_path / 'wf' / 'report' / 'report.html'}" in out.output
    (run,) = rows(postgres_url, "SELECT * FROM walk_forward_runs")
    assert run["finished"] is not None
    assert run["summary"]["windows"] == 2
    windows = rows(postgres_url, 'SELECT * FROM walk_forward_windows ORDER BY "index"')
    assert [w["index"] for w in windows] == [0, 1]
    for w in windows:
        icm = w["icm_stats"]
        assert icm["count"] > 10
        assert np.isfinite(icm["mean"])
        assert icm["novelty_ratio"] > 0
        assert w["metrics"]["regime"] in {"bull", "bear", "sideways"}
    versions = rows(postgres_url, "SELECT * FROM model_versions ORDER BY version")
    assert [v["manifest"]["icm"] is not None for v in versions] == [True, True]
    assert all("icm.onnx" in v["checksums"] for v in versions)


def test_an_unmigrated_database_is_refused_before_any_training(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    with pytest.raises(WalkForwardError, match="allocator db upgrade"):
        run_walk_forward(tiny(tmp_path, f"database_url={url}"), progress=False)
    assert not (tmp_path / "models").exists()


def test_a_failing_window_closes_the_run_with_its_error(tmp_path: Path) -> None:
    url = migrated_sqlite(tmp_path)
    config = tiny(tmp_path, f"database_url={url}", "trainer.env.max_assets=2")
    with pytest.raises(ConfigError, match=r"lists 4 assets but env\.max_assets is 2"):
        run_walk_forward(config, progress=False)
    (run,) = rows(url, "SELECT * FROM walk_forward_runs")
    assert run["finished"] is not None
    summary = as_json(run["summary"])
    assert summary["windows_done"] == 0
    assert "max_assets" in summary["error"]
    assert rows(url, "SELECT * FROM walk_forward_windows") == []


@pytest.mark.parametrize("executor", ["processes", pytest.param("ray", marks=pytest.mark.slow)])
def test_parallel_executors_give_the_local_results(
    local_run: LocalRun, tmp_path: Path, executor: str
) -> None:
    """Each window in a worker process or a Ray task, 2 at a time: identical figures and
    weights to the windows run one after another in this process."""
    config = tiny(tmp_path, "record=false", f"executor={executor}", "workers=2")
    ray_result = run_walk_forward(config, progress=False)
    assert ray_result.summary["executor"] == executor
    assert ray_result.run_id is None
    for a, b in zip(local_run.result.windows, ray_result.windows, strict=True):
        assert a.window == b.window
        assert a.metrics() == b.metrics()
        assert a.baseline_metrics() == b.baseline_metrics()
        pd.testing.assert_frame_equal(a.agent.raw_weights, b.agent.raw_weights)
        pd.testing.assert_series_equal(a.agent.nav, b.agent.nav)

    def figures(summary: dict[str, Any]) -> dict[str, Any]:
        """The summary without what differs by design: run label (versions), time, executor."""
        out = {k: v for k, v in summary.items() if k not in {"seconds", "executor"}}
        out["per_window"] = [{**r, "version": None} for r in summary["per_window"]]
        return out

    assert figures(ray_result.summary) == figures(local_run.result.summary)


# --- summary and regimes without training --------------------------------------------------


def fake_window(index: int, year: int, agent: str) -> WindowResult:
    """A window whose "agent" is a baseline: the summary logic on known figures."""
    data = load_sp500().select(["AAPL", "MSFT", "JPM", "XOM", "KO"])
    start, end = f"{year}-01-01", f"{year}-12-31"
    window = Window(
        index,
        pd.Timestamp(f"{year - 2}-01-02").date(),
        pd.Timestamp(f"{year - 1}-12-20").date(),
        data.dates[data.date_index(start)].date(),
        data.dates[data.date_index(end, "right")].date(),
    )
    baselines = evaluate_baselines(
        data, start, end, cost_bps=10, assets=None,
        train_start=window.train_start, train_end=window.train_end,
    )  # fmt: skip
    return WindowResult(
        window=window,
        version=f"v{index}",
        version_dir="",
        run_dir="",
        algorithm="td3",
        manifest={},
        agent=run_backtest(agent, data, start, end, cost_bps=10),
        baselines=baselines,
        icm=None,
        torch_validation={},
        train_seconds=0.0,
        seconds=0.0,
    )


def test_summary_splits_windows_by_the_equal_weight_regime(tmp_path: Path) -> None:
    windows = [
        fake_window(0, 2018, "min-variance"),
        dataclasses.replace(fake_window(1, 2019, "cash"), manifest={"holds_anchor": True}),
        fake_window(2, 2021, "buy-and-hold"),
        fake_window(3, 2022, "hrp"),
    ]
    thresholds = RegimeThresholds(bull_above=0.15, bear_below=-0.05)
    summary = summarize(windows, thresholds, Goals(positive_sharpe=0.5, beats_equal_weight=0.5))
    per = summary["per_window"]
    ew_returns = [w.baselines["equal-weight"].metrics()["annual_return"] for w in windows]
    expected = ["bull" if r >= 0.15 else "bear" if r < -0.05 else "sideways" for r in ew_returns]
    assert [r["regime"] for r in per] == expected
    assert {"bull", "sideways"} <= set(expected)
    assert per[1]["sharpe"] == 0.0  # cash: a flat line scores 0, not positive
    assert [r["holds_anchor"] for r in per] == [False, True, False, False]
    assert summary["windows_holding_anchor"] == 1
    assert "held the anchor (no inner-span skill): 1 of 4 windows" in format_summary(summary)
    assert summary["positive_sharpe"] == np.mean([r["sharpe"] > 0 for r in per])
    for regime in ("bull", "bear", "sideways"):
        group = [r for r in per if r["regime"] == regime]
        stats = summary["by_regime"][regime]
        assert stats["windows"] == len(group)
        if group:
            assert stats["beats_equal_weight"] == np.mean([r["excess_sharpe"] > 0 for r in group])
            assert stats["mean_turnover"] == pytest.approx(np.mean([r["turnover"] for r in group]))
        else:
            assert stats["positive_sharpe"] is None
    goal = summary["goals"]["positive_sharpe"]
    assert goal["met"] == (summary["positive_sharpe"] >= 0.5)
    assert summary["baselines"]["hrp"]["mean_sharpe"] == pytest.approx(
        np.mean([w.baseline_metrics()["hrp"]["sharpe"] for w in windows])
    )
    assert "sideways" in format_summary(summary)

    config = WalkForwardConfig(windows=WindowSpec(start="2016-01-01", end="2022-12-31"))
    report = WalkForwardResult("L", config, tmp_path, windows, summary)
    files = write_report(report, tmp_path)
    assert json.loads(files["summary"].read_text())["windows"][3]["version"] == "v3"
    assert files["equity"].stat().st_size > 0
