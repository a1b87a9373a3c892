"""The market suite end to end on its smallest useful size, and the guard on its draws.

The command trains the default recipe a few hundred steps on one draw of two markets and
must print the table and write suite.json and suite.png; development mode never reaches a
held-out draw and held-out mode never a development one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from allocator.cli import main
from allocator.trainer.jobs.suite.config import load_suite_config
from allocator.trainer.jobs.suite.job import MEMBER_SEED_STRIDE, draw_settings
from allocator.trainer.jobs.suite.report import gap_closed, summarize
from allocator.trainer.jobs.suite.runner import plan
from allocator.trainer.market.draws import DRAWS, HeldOutDrawError
from allocator.typed_config import ConfigError

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
SUITE = CONFIGS / "suite.yaml"


def test_the_suite_runs_by_one_command_and_writes_table_json_and_plot(tmp_path):
    out = tmp_path / "suite"
    args = [
        "suite", "run", "--config", str(SUITE), "--markets", "entering_leaving,random_walk",
        "--draws", "1", "--steps", "300", "--executor", "local", "--out", str(out),
        "--set", "trainer.algorithm.learning_starts=100", "--set", "bootstrap_reps=200",
        "--no-progress", "--json-out", str(tmp_path / "copy.json"),
    ]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "| entering_leaving | 1 |" in result.output
    assert "| random_walk | 1 |" in result.output
    document = json.loads((out / "suite.json").read_text())
    assert document["mode"] == "development"
    assert [r["draw"] for r in document["rows"]] == [100, 100]
    listing = document["summary"]["entering_leaving"]
    assert listing["ceiling_sharpe"] is not None  # the known drifters, held out too
    assert listing["policy_turnover"] is not None
    assert document["summary"]["random_walk"]["ceiling_sharpe"] is None
    for row in document["rows"]:
        assert 0.0 <= row["near_bound"] <= 1.0
        assert row["rule"].startswith(("TopKMomentum", "TopKReversal"))
    assert (out / "suite.png").stat().st_size > 1000
    assert (out / "table.md").read_text().startswith("| market |")
    assert json.loads((tmp_path / "copy.json").read_text()) == document


def test_development_mode_plans_development_draws_and_heldout_mode_held_out_ones(tmp_path):
    dev = plan(load_suite_config(SUITE, ["draws=2"]), tmp_path)
    held = plan(load_suite_config(CONFIGS / "suite_ci.yaml"), tmp_path)
    for job in dev:
        assert job.draw in DRAWS[job.kind].development
        assert job.trainer["data"]["dataset"] in (f"generated:{job.kind}:{job.draw}", "sp500")
    assert sorted((j.kind, j.draw) for j in held) == [
        ("random_walk", DRAWS["random_walk"].held_out[0]),
        *(("rotating_short", d) for d in DRAWS["rotating_short"].held_out[:2]),
    ]
    for job in held:
        assert job.draw in DRAWS[job.kind].held_out
        assert job.draw not in DRAWS[job.kind].development
    sp500 = [j for j in dev if j.kind == "sp500_dev"]
    assert [j.draw for j in sp500] == [2005, 2006, 2007, 2008, 2009]
    assert all(j.trainer["data"]["validation_end"] < "2010" for j in sp500)


def test_development_mode_refuses_years_the_walk_forward_tests_on():
    config = load_suite_config(SUITE, ["markets=[sp500_dev]", "sp500_years=[2009,2010]"])
    with pytest.raises(HeldOutDrawError, match="sp500_dev draw 2010 is not a development draw"):
        plan(config, Path("unused"))


def test_an_unknown_market_is_refused_with_the_known_ones():
    result = CliRunner().invoke(main, ["suite", "run", "--config", str(SUITE), "--markets", "x"])
    assert result.exit_code == 2
    assert "unknown market(s) ['x']" in result.output


def test_the_sp500_draw_is_a_test_year_with_five_training_years_before_it():
    data = draw_settings("sp500_dev", 2007)["data"]
    assert (data["train_start"], data["train_end"]) == ("2002-01-01", "2006-12-31")
    assert (data["validation_start"], data["validation_end"]) == ("2007-01-01", "2007-12-31")


def test_gap_closed_and_its_summary_over_draws():
    assert gap_closed(1.5, 1.0, 2.0, min_gap=0.1) == pytest.approx(0.5)
    assert gap_closed(1.5, 1.0, 1.05, min_gap=0.1) is None
    rows = [
        {"market": "m", "draw": d, "signal": True, "rule": "r", "policy_sharpe": p,
         "rule_sharpe": 1.0, "ceiling_sharpe": 2.0, "anchor_sharpe": 0.5,
         "equal_weight_sharpe": 0.5, "near_bound": 0.1, "near_bound_max_dim": 0.3}
        for d, p in enumerate([1.2, 1.4, 1.6, 1.8, 2.0])
    ]  # fmt: skip
    summary = summarize(rows, reps=500)["m"]
    assert summary["gap_closed"]["of_means"] == pytest.approx(0.6)
    assert summary["policy_minus_rule"]["ahead"] == 5
    low, high = summary["policy_minus_rule"]["interval"]
    assert 0.0 < low < 0.6 < high
    assert summary["near_bound"]["max_dim_max"] == pytest.approx(0.3)


def test_draws_per_market_replaces_draws_for_its_market_and_is_checked():
    config = load_suite_config(
        SUITE, ["markets=[drift,random_walk]", "draws=2", "draws_per_market={random_walk: 1}"]
    )
    jobs = plan(config, Path("unused"))
    assert [(j.kind, j.draw) for j in jobs] == [
        ("drift", 100),
        ("drift", 101),
        ("random_walk", 100),
    ]
    with pytest.raises(ConfigError, match=r"unknown market\(s\) \['x'\]"):
        load_suite_config(SUITE, ["draws_per_market={x: 1}"])
    with pytest.raises(ConfigError, match=r"draws_per_market\.drift.*greater than 0"):
        load_suite_config(SUITE, ["draws_per_market={drift: 0}"])


def test_seeds_score_each_draw_by_its_seed_ensemble(tmp_path):
    """``seeds: 2`` trains two runs of the draw, seeds MEMBER_SEED_STRIDE apart, and scores the
    mean of their actions, which trades otherwise than either member alone (each keeps its
    checkpoint: 300 steps show no skill, and the fallback would make both the anchor)."""
    out = tmp_path / "suite"
    args = [
        "suite", "run", "--config", str(SUITE), "--markets", "entering_leaving", "--draws", "1",
        "--steps", "300", "--executor", "local", "--out", str(out), "--no-progress",
        "--set", "trainer.algorithm.learning_starts=100", "--set", "bootstrap_reps=200",
        "--set", "seeds=2", "--set", "trainer.selection.fallback_level=null",
    ]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    (row,) = json.loads((out / "suite.json").read_text())["rows"]
    first = Path(row["run_dir"])
    seeds = [
        json.loads((d / "manifest.json").read_text())["seed"]
        for d in (first, first.with_name(first.name + "-m1"))
    ]
    assert seeds == [row["seed"], row["seed"] + MEMBER_SEED_STRIDE]
    assert len(row["member_sharpes"]) == 2
    assert row["policy_sharpe"] not in row["member_sharpes"]
    assert 0.0 <= row["near_bound"] <= 1.0
