"""The walk-forward summary: net Sharpe positive, beating equal weight, median excess Sharpe and
turnover, overall, per regime and per baseline, and the goals met or not.

Means and medians skip missing and non-finite values (one NaN window does not poison the mean);
fractions count every window."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from allocator.trainer.jobs.walk_forward.config import (
    EQUAL_WEIGHT,
    REGIMES,
    Goals,
    RegimeThresholds,
)
from allocator.trainer.jobs.walk_forward.results import WindowResult
from allocator.trainer.jobs.walk_forward.significance import headline


def finite_mean(
    values: Iterable[float | None], stat: Callable[[list[float]], float] = statistics.fmean
) -> float | None:
    """``stat`` (the mean) of the finite values; None when there is none."""
    v = [x for x in values if x is not None and math.isfinite(x)]
    return float(stat(v)) if v else None


def window_row(result: WindowResult, regimes: RegimeThresholds) -> dict[str, Any]:
    """The figures of one window the summary and the report use."""
    m = result.metrics()
    ew = result.baselines[EQUAL_WEIGHT].metrics()
    return {
        "index": result.window.index,
        "label": result.window.label,
        **result.window.to_dict(),
        "version": result.version,
        "sharpe": m["sharpe"],
        "equal_weight_sharpe": ew["sharpe"],
        "excess_sharpe": m["sharpe"] - ew["sharpe"],
        "turnover": m["turnover"],
        "total_return": m["total_return"],
        "max_drawdown": m["max_drawdown"],
        "equal_weight_annual_return": ew["annual_return"],
        "regime": regimes.classify(ew["annual_return"]),
        "baseline_sharpe": {n: b["sharpe"] for n, b in result.baseline_metrics().items()},
        "resumed_from": result.resumed_from,
    }


def group_stats(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The summary figures of a group of window rows (all windows, or one regime's)."""
    n = len(rows)
    if n == 0:
        keys = ("positive_sharpe", "beats_equal_weight", "median_excess_sharpe")
        return {"windows": 0, **dict.fromkeys((*keys, "mean_turnover", "mean_sharpe"))}
    return {
        "windows": n,
        "positive_sharpe": sum(r["sharpe"] > 0 for r in rows) / n,
        "beats_equal_weight": sum(r["excess_sharpe"] > 0 for r in rows) / n,
        "median_excess_sharpe": finite_mean((r["excess_sharpe"] for r in rows), statistics.median),
        "mean_turnover": finite_mean(r["turnover"] for r in rows),
        "mean_sharpe": finite_mean(r["sharpe"] for r in rows),
    }


def summarize(
    results: Sequence[WindowResult], regimes: RegimeThresholds, goals: Goals
) -> dict[str, Any]:
    """Fractions of windows with positive Sharpe and beating equal weight (net Sharpe), the
    median excess Sharpe and mean turnover, overall and per regime, plus the baselines'."""
    rows = [window_row(r, regimes) for r in sorted(results, key=lambda r: r.window.index)]
    overall = group_stats(rows)
    names = list(rows[0]["baseline_sharpe"]) if rows else []
    baselines = {
        n: {
            "mean_sharpe": finite_mean(r["baseline_sharpe"][n] for r in rows),
            "positive_sharpe": (sum(r["baseline_sharpe"][n] > 0 for r in rows) / len(rows)),
        }
        for n in names
    }
    met = {
        key: {
            "target": target,
            "value": overall[key],
            "met": overall[key] is not None and overall[key] >= target,
        }
        for key, target in goals.model_dump().items()
    }
    return {
        **overall,
        "by_regime": {g: group_stats([r for r in rows if r["regime"] == g]) for g in REGIMES},
        "regime_thresholds": regimes.model_dump(),
        "baselines": baselines,
        "goals": met,
        "per_window": rows,
    }


def attach_statistics(summary: dict[str, Any], statistics: dict[str, Any]) -> None:
    """Put a run's statistics (``significance.run_statistics``) in its summary: all of them
    under ``statistics``, and each window's interval, SPA p-value and deflated Sharpe in its
    row, beside the Sharpe they qualify."""
    by_label = {s["window"]: s for s in statistics["windows"]}
    for row in summary["per_window"]:
        if row["label"] in by_label:
            row.update(headline(by_label[row["label"]]))
    summary["statistics"] = statistics
