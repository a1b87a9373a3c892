"""The walk-forward summary and statistics, from ``returns.csv`` alone and seeded: reproducible.

Means skip non-finite values (one NaN window does not poison them); fractions count every window.
The bootstrap pairs the days of model and benchmark, so common market noise cancels."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from allocator.trainer.jobs.walk_forward.config import (
    EQUAL_WEIGHT,
    REGIMES,
    Goals,
    RegimeThresholds,
    StatisticsSettings,
)
from allocator.trainer.jobs.walk_forward.rundir import AGENT, DATE, WINDOW, WindowResult
from allocator.trainer.sim.baselines import ANCHOR
from allocator.trainer.statistics.deflated import deflated_sharpe_of_returns
from allocator.trainer.statistics.sharpe import ExcessSharpe, excess_sharpe_interval
from allocator.trainer.statistics.spa import policy_superiority

POOLED = "pooled"


def baseline_columns(frame: pd.DataFrame) -> list[str]:
    """The baselines' columns of a returns frame (everything but date, window and the model)."""
    return [c for c in frame.columns if c not in (DATE, WINDOW, AGENT)]


def excess_interval(
    agent: np.ndarray, benchmark: np.ndarray, settings: StatisticsSettings
) -> ExcessSharpe:
    """The model's excess Sharpe over ``benchmark`` and its interval, as ``settings`` draw it."""
    return excess_sharpe_interval(
        agent,
        benchmark,
        level=settings.level,
        reps=settings.reps,
        block=settings.block_size,
        seed=settings.seed,
        method=settings.interval,
    )


def span_statistics(
    label: str,
    frame: pd.DataFrame,
    settings: StatisticsSettings,
    configurations_tried: int,
) -> dict[str, Any]:
    """The three statistics of one span of days (a window, or all windows pooled)."""
    agent = frame[AGENT].to_numpy(dtype=float)
    row: dict[str, Any] = {"window": label, "days": int(agent.size)}

    def excess_over(benchmark: str) -> ExcessSharpe:
        return excess_interval(agent, frame[benchmark].to_numpy(dtype=float), settings)

    try:
        excess = excess_over(EQUAL_WEIGHT)
        spa = policy_superiority(
            agent,
            {name: frame[name].to_numpy(dtype=float) for name in baseline_columns(frame)},
            block=settings.block_size,
            reps=settings.reps,
            seed=settings.seed,
        )
        deflated = deflated_sharpe_of_returns(
            agent, configurations_tried, settings.trials_sharpe_variance
        )
        over_anchor = excess_over(ANCHOR) if ANCHOR in frame else None
    except ValueError as exc:
        return {**row, "error": str(exc)}
    out = {
        **row,
        "excess_sharpe": excess.to_dict(),
        "spa": spa.to_dict(),
        "deflated_sharpe": deflated.to_dict(),
    }
    if over_anchor is not None:
        out["excess_sharpe_over_anchor"] = over_anchor.to_dict()
    return out


def run_statistics(
    frame: pd.DataFrame, settings: StatisticsSettings, configurations_tried: int
) -> dict[str, Any]:
    """Per window (in the frame's order) and pooled, with the settings that drew them."""
    windows = [
        span_statistics(str(label), part, settings, configurations_tried)
        for label, part in frame.groupby(WINDOW, sort=False)
    ]
    return {
        "settings": {
            **settings.model_dump(mode="json"),
            "configurations_tried": configurations_tried,
            "benchmark": EQUAL_WEIGHT,
            "baselines": baseline_columns(frame),
        },
        "windows": windows,
        POOLED: span_statistics(POOLED, frame, settings, configurations_tried),
    }


def headline(stats: dict[str, Any]) -> dict[str, float | None]:
    """The figures of a span that go beside its Sharpe in the summary's rows and tables."""
    if "error" in stats:
        return dict.fromkeys(
            ("excess_sharpe_low", "excess_sharpe_high", "spa_pvalue", "deflated_sharpe")
        )
    return {
        "excess_sharpe_low": stats["excess_sharpe"]["low"],
        "excess_sharpe_high": stats["excess_sharpe"]["high"],
        "spa_pvalue": stats["spa"]["pvalues"]["consistent"],
        "deflated_sharpe": stats["deflated_sharpe"]["deflated"],
    }


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
        "holds_anchor": bool(result.manifest.get("holds_anchor", False)),
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
    """The window figures overall, per regime and per baseline, and the goals met or not."""
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
        "windows_holding_anchor": sum(r["holds_anchor"] for r in rows),
        "by_regime": {g: group_stats([r for r in rows if r["regime"] == g]) for g in REGIMES},
        "regime_thresholds": regimes.model_dump(),
        "baselines": baselines,
        "goals": met,
        "per_window": rows,
    }


def attach_statistics(summary: dict[str, Any], statistics: dict[str, Any]) -> None:
    """Put ``run_statistics`` in the summary, and each window's headline figures in its row."""
    by_label = {s["window"]: s for s in statistics["windows"]}
    for row in summary["per_window"]:
        if row["label"] in by_label:
            row.update(headline(by_label[row["label"]]))
    summary["statistics"] = statistics
