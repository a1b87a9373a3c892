"""Seed luck apart from period luck: several walk-forward runs of one recipe, seeds apart, read from
their ``returns.csv``. Runs of different recipes are refused: their spread is not seed variance."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from allocator.trainer.jobs.walk_forward.config import (
    EQUAL_WEIGHT,
    StatisticsSettings,
    WalkForwardError,
    config_differences,
)
from allocator.trainer.jobs.walk_forward.rundir import (
    AGENT,
    DATE,
    RETURNS_FILE,
    WINDOW,
    read_returns,
    read_state,
)
from allocator.trainer.jobs.walk_forward.summary import baseline_columns, excess_interval
from allocator.trainer.statistics.sharpe import annualized_sharpe

RECIPE = (
    "trainer",
    "windows",
    "cost_bps",
    "baselines",
    "baseline_fit",
    "baseline_rebalance_every",
    "torch_threads",
)
"""Config keys that must be equal across a seed study: what is trained and how it is judged."""
TRAINER_SEED_FREE = frozenset({"seed", "name", "output_dir"})  # trainer keys that may differ


@dataclass(frozen=True)
class SeedRun:
    """One run of the study: where it is, its base seed, its daily returns and its recipe."""

    run_dir: str
    seed: int
    returns: pd.DataFrame
    recipe: dict[str, Any]


def recipe(config: dict[str, Any]) -> dict[str, Any]:
    """The part of a run's resolved config that must match across the study."""
    out = {k: config.get(k) for k in RECIPE}
    out["trainer"] = {k: v for k, v in (out["trainer"] or {}).items() if k not in TRAINER_SEED_FREE}
    return out


def load_seed_runs(run_dirs: Sequence[str | Path]) -> list[SeedRun]:
    """The runs of a study, checked to be one recipe with distinct seeds."""
    if len(run_dirs) < 2:
        raise WalkForwardError("a seed study needs at least two runs of the same recipe")
    runs: list[SeedRun] = []
    for run_dir in run_dirs:
        returns = read_returns(Path(run_dir) / RETURNS_FILE)
        config = read_state(run_dir).config
        seed = config["trainer"]["seed"] if config.get("seed") is None else config["seed"]
        runs.append(SeedRun(str(run_dir), int(seed), returns, recipe(config)))
    first = runs[0]
    for run in runs[1:]:
        diffs = config_differences(first.recipe, run.recipe, free=frozenset())
        if diffs:
            raise WalkForwardError(
                f"{run.run_dir} is not the recipe of {first.run_dir}: their configs differ at "
                f"{diffs[0][0]!r} (a seed study compares seeds of one recipe)"
            )
        same_days = run.returns[[DATE, WINDOW]].equals(first.returns[[DATE, WINDOW]])
        if not same_days:
            raise WalkForwardError(f"{run.run_dir} and {first.run_dir} cover different days")
        baselines = baseline_columns(first.returns)
        if baseline_columns(run.returns) != baselines or not np.allclose(
            run.returns[baselines].to_numpy(float),
            first.returns[baselines].to_numpy(float),
            rtol=0,
            atol=1e-12,
            equal_nan=True,
        ):
            raise WalkForwardError(
                f"{run.run_dir} and {first.run_dir} have different baseline returns: not the "
                "same windows, assets or costs"
            )
    seeds = [r.seed for r in runs]
    if len(set(seeds)) != len(seeds):
        raise WalkForwardError(f"the runs must have distinct seeds, got {seeds}")
    return runs


def variance_split(excess: np.ndarray) -> dict[str, float]:
    """Seed and period variance of a ``(windows, seeds)`` matrix of excess Sharpe ratios: seed
    variance the mean within-window variance, period variance that of the window means less
    ``seed_variance / seeds``, floored at 0 (no period effect detectable beyond seed noise)."""
    m = np.asarray(excess, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] < 2 or m.shape[1] < 2:
        raise ValueError(f"need at least 2 windows and 2 seeds, got shape {m.shape}")
    if not np.isfinite(m).all():
        raise ValueError("excess Sharpe ratios must be finite")
    seed_var = float(m.var(axis=1, ddof=1).mean())
    means_var = float(m.mean(axis=1).var(ddof=1))
    period_var = max(0.0, means_var - seed_var / m.shape[1])
    return {
        "mean": float(m.mean()),
        "seed_variance": seed_var,
        "period_variance": period_var,
        "seed_sd": math.sqrt(seed_var),
        "period_sd": math.sqrt(period_var),
        "windows": int(m.shape[0]),
        "seeds": int(m.shape[1]),
    }


def window_excess(frame: pd.DataFrame) -> pd.Series:
    """Each window's excess annualized Sharpe of the model over equal weight."""
    return pd.Series(
        {
            label: annualized_sharpe(part[AGENT]) - annualized_sharpe(part[EQUAL_WEIGHT])
            for label, part in frame.groupby(WINDOW, sort=False)
        },
        dtype=float,
    )


def seed_study(run_dirs: Sequence[str | Path]) -> dict[str, Any]:
    """Per window every seed's excess Sharpe over equal weight, its seed and period variance,
    per seed the pooled excess Sharpe, and the equal-capital mix of the seeds' books."""
    settings = StatisticsSettings()
    runs = load_seed_runs(run_dirs)
    per_seed = pd.DataFrame({r.seed: window_excess(r.returns) for r in runs})
    ew = runs[0].returns[EQUAL_WEIGHT].to_numpy(float)
    mix = np.mean([r.returns[AGENT].to_numpy(float) for r in runs], axis=0)
    return {
        "settings": settings.model_dump(mode="json"),
        "runs": [
            {
                "run_dir": r.run_dir,
                "seed": r.seed,
                "windows_beating_equal_weight": int((per_seed[r.seed] > 0).sum()),
                "pooled_excess_sharpe": excess_interval(
                    r.returns[AGENT].to_numpy(float), ew, settings
                ).to_dict(),
            }
            for r in runs
        ],
        "windows": [
            {
                "window": str(label),
                "excess_sharpe": {str(s): float(v) for s, v in row.items()},
                "mean": float(row.mean()),
                "sd": float(row.std(ddof=1)),
                "seeds_beating_equal_weight": int((row > 0).sum()),
            }
            for label, row in per_seed.iterrows()
        ],
        "variance": variance_split(per_seed.to_numpy()),
        "mix": {
            "description": "equal-capital mix of the seeds' books, rebalanced daily",
            "windows_beating_equal_weight": int(
                (window_excess(runs[0].returns.assign(**{AGENT: mix})) > 0).sum()
            ),
            "pooled_excess_sharpe": excess_interval(mix, ew, settings).to_dict(),
        },
    }


def format_seed_study(study: dict[str, Any]) -> str:
    """The study as the text ``allocator walk-forward seeds`` prints."""
    seeds = [str(r["seed"]) for r in study["runs"]]
    lines = ["excess Sharpe over equal weight, per window and seed:"]
    head = f"  {'window':<8}" + "".join(f"{'seed ' + s:>11}" for s in seeds)
    lines.append(head + f"{'mean':>9}{'sd':>8}")
    for w in study["windows"]:
        cells = "".join(f"{w['excess_sharpe'][s]:>+11.2f}" for s in seeds)
        lines.append(f"  {w['window']:<8}{cells}{w['mean']:>+9.2f}{w['sd']:>8.2f}")
    v = study["variance"]
    lines.append(
        f"variance of the window figures: seed {v['seed_variance']:.4f} (sd {v['seed_sd']:.2f}), "
        f"period {v['period_variance']:.4f} (sd {v['period_sd']:.2f}); "
        f"{v['windows']} windows x {v['seeds']} seeds, mean {v['mean']:+.3f}"
    )
    lines.append("pooled excess Sharpe per seed:")
    for r in study["runs"]:
        e = r["pooled_excess_sharpe"]
        lines.append(
            f"  seed {r['seed']:<6} {e['estimate']:+.3f} [{e['low']:+.3f}, {e['high']:+.3f}]  "
            f"beats equal weight in {r['windows_beating_equal_weight']} of {v['windows']} windows"
        )
    e = study["mix"]["pooled_excess_sharpe"]
    lines.append(
        f"{study['mix']['description']}: {e['estimate']:+.3f} [{e['low']:+.3f}, "
        f"{e['high']:+.3f}], beats equal weight in "
        f"{study['mix']['windows_beating_equal_weight']} of {v['windows']} windows "
        f"({e['level']:.0%} stationary-bootstrap intervals, {e['reps']} draws, seed {e['seed']})"
    )
    return "\n".join(lines)
