"""``allocator walk-forward seeds``: seed variance apart from period variance, over runs of one
recipe that differ only in their seed; runs of another recipe are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from allocator.cli import main
from allocator.trainer.jobs.walk_forward.config import EQUAL_WEIGHT, WalkForwardError
from allocator.trainer.jobs.walk_forward.rundir import (
    AGENT,
    RETURNS_FILE,
    STATE_FILE,
    read_returns,
    write_returns,
)
from allocator.trainer.jobs.walk_forward.runner import run_walk_forward
from allocator.trainer.jobs.walk_forward.seeds import seed_study, variance_split
from tests.trainer.jobs.conftest import LocalRun
from tests.trainer.jobs.helpers import tiny


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory: pytest.TempPathFactory, local_run: LocalRun) -> list[Path]:
    """The tiny recipe at seed 0 (the shared local run) and again at seed 7."""
    tmp = tmp_path_factory.mktemp("walk-forward-seed-7")
    other = run_walk_forward(tiny(tmp, "record=false", "seed=7"), progress=False)
    return [Path(local_run.result.out_dir), Path(other.out_dir)]


def copy_run(source: Path, dest: Path, *, seed: int | None = None, **config: object) -> Path:
    """A run directory holding only what the study reads, with its config edited."""
    dest.mkdir(parents=True)
    shutil.copy(source / RETURNS_FILE, dest / RETURNS_FILE)
    state = json.loads((source / STATE_FILE).read_text())
    if seed is not None:
        state["config"]["seed"] = seed
    for dotted, value in config.items():
        node = state["config"]
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node[key]
        node[leaf] = value
    (dest / STATE_FILE).write_text(json.dumps(state))
    return dest


def test_two_real_seeds_of_the_tiny_recipe(two_seeds: list[Path], tmp_path: Path) -> None:
    """The CLI on two real runs: one row per window with both seeds, the seeds' figures
    differ (training luck is real), each equals that run's own window excess Sharpe."""
    out = tmp_path / "seeds.json"
    args = ["walk-forward", "seeds", *map(str, two_seeds), "--json-out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "seed 0" in result.output
    assert "seed 7" in result.output
    assert "variance of the window figures: seed" in result.output
    study = json.loads(out.read_text())
    assert [r["seed"] for r in study["runs"]] == [0, 7]
    assert [w["window"] for w in study["windows"]] == ["w00", "w01"]
    for run in two_seeds:
        summary = json.loads((run / "summary.json").read_text())
        seed = str(json.loads((run / STATE_FILE).read_text())["config"]["seed"])
        for row, window in zip(summary["windows"], study["windows"], strict=True):
            assert window["excess_sharpe"][seed] == pytest.approx(row["excess_sharpe"], abs=1e-9)
    per_window = [w["excess_sharpe"] for w in study["windows"]]
    assert any(w["0"] != w["7"] for w in per_window)
    assert study["variance"]["windows"] == 2
    assert study["variance"]["seeds"] == 2
    mix = study["mix"]["pooled_excess_sharpe"]
    assert mix["low"] <= mix["estimate"] <= mix["high"]


def test_variance_split_on_a_hand_computed_matrix() -> None:
    # windows x seeds: within-window variances 2 and 2 -> seed 2; window means 2 and 6 have
    # variance 8, of which 2/2 is seed noise -> period 7.
    split = variance_split(np.array([[1.0, 3.0], [5.0, 7.0]]))
    assert split["seed_variance"] == pytest.approx(2.0)
    assert split["period_variance"] == pytest.approx(7.0)
    assert split["mean"] == pytest.approx(4.0)
    # Window means equal: no period effect, floored at 0 rather than negative.
    assert variance_split(np.array([[0.0, 4.0], [4.0, 0.0]]))["period_variance"] == 0.0
    with pytest.raises(ValueError, match="at least 2 windows and 2 seeds"):
        variance_split(np.array([[1.0, 2.0]]))


def synthetic_seeds(
    base: Path, tmp_path: Path, window_effect: float, seed_effect: float
) -> list[Path]:
    """Three runs (the real run's config, seeds 11-13) over 8 generated 60-day windows whose
    model earns equal weight's return plus a daily edge per window (the same for every seed)
    plus one per (window, seed): an excess Sharpe of about edge * sqrt(252) / 1%."""
    rng = np.random.default_rng(3)
    n_windows, days = 8, 60
    dates = pd.bdate_range("2020-01-01", periods=n_windows * days)
    labels = np.repeat([f"w{i:02d}" for i in range(n_windows)], days)
    ew = rng.normal(4e-4, 0.01, len(dates))
    frame = pd.DataFrame({"date": dates, "window": labels, EQUAL_WEIGHT: ew, "hrp": ew * 0.8})
    by_window = rng.normal(0, window_effect, n_windows)
    runs = []
    for seed in (11, 12, 13):
        edge = np.repeat(by_window + rng.normal(0, seed_effect, n_windows), days)
        agent = ew + edge + rng.normal(0, 1e-4, len(dates))
        run = copy_run(base, tmp_path / f"seed{seed}", seed=seed)
        write_returns(frame.assign(**{AGENT: agent}), run)
        runs.append(run)
    return runs


def test_period_luck_and_seed_luck_are_told_apart(two_seeds: list[Path], tmp_path: Path) -> None:
    period = seed_study(synthetic_seeds(two_seeds[0], tmp_path / "p", 1e-3, 1e-5))["variance"]
    seed = seed_study(synthetic_seeds(two_seeds[0], tmp_path / "s", 1e-5, 1e-3))["variance"]
    assert period["period_variance"] > 10 * period["seed_variance"], period
    assert seed["seed_variance"] > 3 * seed["period_variance"], seed
    # A daily edge of 1e-3 on 1% volatility is an excess Sharpe of about 1.6.
    assert 0.5 < period["period_sd"] < 4.0, period
    assert 0.5 < seed["seed_sd"] < 4.0, seed


def test_runs_of_another_recipe_are_refused(two_seeds: list[Path], tmp_path: Path) -> None:
    base = two_seeds[0]
    same = copy_run(base, tmp_path / "same")
    with pytest.raises(WalkForwardError, match=r"distinct seeds, got \[0, 0\]"):
        seed_study([base, same])
    longer = copy_run(base, tmp_path / "longer", seed=5, trainer__total_timesteps=600)
    with pytest.raises(WalkForwardError, match=r"'trainer\.total_timesteps'"):
        seed_study([base, longer])
    costs = copy_run(base, tmp_path / "costs", seed=6, cost_bps=20)
    with pytest.raises(WalkForwardError, match="'cost_bps'"):
        seed_study([base, costs])
    other = copy_run(base, tmp_path / "baseline", seed=8)
    frame = read_returns(other / RETURNS_FILE)
    frame.loc[3, EQUAL_WEIGHT] += 0.01
    write_returns(frame, other)
    with pytest.raises(WalkForwardError, match="different baseline returns"):
        seed_study([base, other])
    short = copy_run(base, tmp_path / "short", seed=9)
    write_returns(read_returns(short / RETURNS_FILE).iloc[:-1], short)
    with pytest.raises(WalkForwardError, match="cover different days"):
        seed_study([base, short])
    with pytest.raises(WalkForwardError, match="at least two runs"):
        seed_study([base])
    result = CliRunner().invoke(main, ["walk-forward", "seeds", str(base), str(longer)])
    assert result.exit_code == 2
    assert "trainer.total_timesteps" in result.output


def test_returns_frame_round_trip_keeps_the_study(two_seeds: list[Path], tmp_path: Path) -> None:
    """Rewriting a run's returns.csv from what was read changes nothing: the study depends on
    the days' values only."""
    copy = copy_run(two_seeds[1], tmp_path / "copy")
    write_returns(pd.DataFrame(read_returns(copy / RETURNS_FILE)), copy)
    assert seed_study([two_seeds[0], copy])["windows"] == seed_study(two_seeds)["windows"]
