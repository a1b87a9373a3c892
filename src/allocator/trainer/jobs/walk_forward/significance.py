"""Intervals and tests of a walk-forward run, per window and pooled (days in time order).

The model's excess Sharpe over equal weight with a stationary-bootstrap interval (paired days,
so common market noise cancels as in the point estimate); Hansen's SPA against every baseline
(the largest consistent p-value); the deflated Sharpe given ``configurations_tried``; with an
``anchor`` column, the excess Sharpe over it. The input is ``returns.csv`` alone, seeded, so a
run's statistics are reproducible; a window too short for a statistic gets an ``error`` entry."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from allocator.trainer.jobs.walk_forward.config import EQUAL_WEIGHT, StatisticsSettings
from allocator.trainer.jobs.walk_forward.results import AGENT
from allocator.trainer.jobs.walk_forward.returns import DATE, WINDOW
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
