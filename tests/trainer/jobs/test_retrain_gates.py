"""Scheduled retraining, unit level: each gate's pass and fail paths, spans and versions."""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from allocator.registry.naming import version_key
from allocator.registry.versions import CANDIDATES_DIR, dated_version
from allocator.trainer.jobs.retrain.config import retrain_spans
from allocator.trainer.jobs.retrain.gates import GateSettings, apply_gates
from allocator.trainer.market.data import DataError


def metrics(**kw: float) -> dict[str, float]:
    """Held-out metrics as ``BacktestResult.metrics()`` gives them (only what gates read)."""
    return {"sharpe": 1.0, "turnover": 0.02, "max_drawdown": 0.1, **kw}


# --- gates, unit level ---------------------------------------------------------------------------


ONLY = {
    "max_sharpe_shortfall": None,
    "max_turnover": None,
    "max_drawdown": None,
    "min_sharpe": None,
    "max_shortfall_vs_equal_weight": None,
}


def only(**gate: float) -> GateSettings:
    return GateSettings(**{**ONLY, **gate})


@pytest.mark.parametrize(
    ("candidate", "production", "passed", "words"),
    [
        (0.95, 1.0, True, "meets the floor 0.9000"),
        (0.90, 1.0, True, "meets the floor 0.9000"),  # exactly the allowed shortfall
        (0.85, 1.0, False, "is below the floor 0.9000"),
        (1.50, 1.0, True, "production 1.0000 less the allowed shortfall 0.1"),
        (math.nan, 1.0, False, "not a number"),
    ],
)
def test_sharpe_vs_production_gate(
    candidate: float, production: float, passed: bool, words: str
) -> None:
    (result,) = apply_gates(
        only(max_sharpe_shortfall=0.1), metrics(sharpe=candidate), metrics(sharpe=production)
    )
    assert result.gate == "sharpe_vs_production"
    assert result.passed is passed
    assert words in result.reason


def test_sharpe_vs_production_passes_without_a_production_model() -> None:
    (result,) = apply_gates(only(max_sharpe_shortfall=0.1), metrics(sharpe=-3.0), None)
    assert result.passed
    assert "no production model" in result.reason
    (result,) = apply_gates(
        only(max_sharpe_shortfall=0.1), metrics(sharpe=-3.0), metrics(sharpe=math.nan)
    )
    assert result.passed
    assert "production's net Sharpe is not a number" in result.reason


@pytest.mark.parametrize(
    ("turnover", "passed", "words"),
    [
        (0.049, True, "mean daily turnover 0.0490 is within the limit 0.0500"),
        (0.05, True, "is within"),
        (0.051, False, "mean daily turnover 0.0510 exceeds the limit 0.0500"),
        (math.inf, False, "not a number"),
    ],
)
def test_turnover_gate(turnover: float, passed: bool, words: str) -> None:
    (result,) = apply_gates(only(max_turnover=0.05), metrics(turnover=turnover), None)
    assert (result.gate, result.passed, result.threshold) == ("turnover", passed, 0.05)
    assert words in result.reason


@pytest.mark.parametrize(
    ("drawdown", "passed", "words"),
    [
        (0.2, True, "max drawdown 0.2000 is within the limit 0.3500"),
        (0.4, False, "max drawdown 0.4000 exceeds the limit 0.3500"),
    ],
)
def test_max_drawdown_gate(drawdown: float, passed: bool, words: str) -> None:
    (result,) = apply_gates(only(max_drawdown=0.35), metrics(max_drawdown=drawdown), None)
    assert (result.gate, result.passed, result.value) == ("max_drawdown", passed, drawdown)
    assert words in result.reason


@pytest.mark.parametrize(("sharpe", "passed"), [(0.1, True), (0.0, True), (-0.1, False)])
def test_min_sharpe_gate(sharpe: float, passed: bool) -> None:
    (result,) = apply_gates(only(min_sharpe=0.0), metrics(sharpe=sharpe), metrics())
    assert (result.gate, result.passed) == ("min_sharpe", passed)
    assert "absolute Sharpe floor" in result.reason


@pytest.mark.parametrize(("sharpe", "passed"), [(0.6, True), (0.3, False)])
def test_sharpe_vs_equal_weight_gate(sharpe: float, passed: bool) -> None:
    gates = only(max_shortfall_vs_equal_weight=0.25)
    (result,) = apply_gates(gates, metrics(sharpe=sharpe), None, metrics(sharpe=0.8))
    assert (result.gate, result.passed) == ("sharpe_vs_equal_weight", passed)
    assert "equal weight 0.8000 less the allowed shortfall 0.25" in result.reason
    (missing,) = apply_gates(gates, metrics(sharpe=sharpe), None, None)
    assert not missing.passed  # a gate that cannot be checked does not pass
    assert "unavailable" in missing.reason


def test_every_configured_gate_reports_and_one_failure_is_enough() -> None:
    gates = GateSettings(
        max_sharpe_shortfall=0.1,
        max_turnover=0.05,
        max_drawdown=0.35,
        min_sharpe=0.0,
        max_shortfall_vs_equal_weight=0.5,
    )
    results = apply_gates(gates, metrics(turnover=0.2), metrics(), metrics(sharpe=0.9))
    assert [r.gate for r in results] == [
        "sharpe_vs_production",
        "turnover",
        "max_drawdown",
        "min_sharpe",
        "sharpe_vs_equal_weight",
    ]
    assert {r.gate for r in results if not r.passed} == {"turnover"}
    assert json.dumps([r.to_dict() for r in results])  # what the promotions row stores


def test_all_gates_off_is_refused() -> None:
    with pytest.raises(ValueError, match="every gate is off"):
        GateSettings(**ONLY)


# --- spans and versions --------------------------------------------------------------------------


DATES = pd.bdate_range("2020-01-01", periods=500)


def test_spans_count_trading_days_back_from_as_of_with_the_purge_gap() -> None:
    s = retrain_spans(DATES, None, train_days=200, purge_days=5, holdout_days=60)
    i = {name: DATES.get_loc(pd.Timestamp(d)) for name, d in s.__dict__.items()}
    assert i["holdout_end"] == len(DATES) - 1
    assert i["holdout_end"] - i["holdout_start"] + 1 == 60
    assert i["holdout_start"] - i["train_end"] - 1 == 5  # exactly the purge gap, between
    assert i["train_end"] - i["train_start"] + 1 == 200
    # A weekend as_of means the Friday before it; nothing after as_of is used.
    friday = next(d for d in DATES[300:] if d.day_of_week == 4)
    later = retrain_spans(
        DATES, friday + pd.Timedelta(days=1), train_days=200, purge_days=0, holdout_days=60
    )
    assert later.holdout_end == friday.date()
    assert later.train_end < later.holdout_start
    assert DATES.get_loc(pd.Timestamp(later.holdout_start)) - 1 == DATES.get_loc(
        pd.Timestamp(later.train_end)
    )


def test_spans_refuse_too_little_data_and_bad_dates() -> None:
    with pytest.raises(DataError, match=r"needs train_days \+ purge_days \+ holdout_days = 501"):
        retrain_spans(DATES, None, train_days=400, purge_days=1, holdout_days=100)
    with pytest.raises(DataError, match="no trading date on or before 2019-06-01"):
        retrain_spans(DATES, "2019-06-01", train_days=10, purge_days=0, holdout_days=10)
    with pytest.raises(DataError, match="not a date"):
        retrain_spans(DATES, "yesterday-ish", train_days=10, purge_days=0, holdout_days=10)


def test_candidate_versions_name_the_date_and_sort_after_integers(tmp_path: Path) -> None:
    day = dt.date(2022, 12, 28)
    assert dated_version(tmp_path, "m", day) == "20221228"
    (tmp_path / "m" / "20221228").mkdir(parents=True)
    (tmp_path / CANDIDATES_DIR / "m" / "20221228.1").mkdir(parents=True)
    (tmp_path / CANDIDATES_DIR / "m" / "20221228.1" / "manifest.json").write_text("{}")
    assert dated_version(tmp_path, "m", day) == "20221228.2"
    ordered = sorted(["20221229", "20221228.2", "3", "20221228", "20221228.10"], key=version_key)
    assert ordered == ["3", "20221228", "20221228.2", "20221228.10", "20221229"]
