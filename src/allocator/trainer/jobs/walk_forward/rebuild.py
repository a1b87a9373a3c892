"""Baselines a finished run did not record, backtested as the run would have
(``allocator walk-forward stats --baseline anchor``): each window's test span on the assets and
costs its model was judged on, joined to the recorded returns. The run directory is only read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from allocator.trainer.jobs.walk_forward.config import WalkForwardError
from allocator.trainer.jobs.walk_forward.persist import window_from
from allocator.trainer.jobs.walk_forward.returns import (
    DATE,
    WINDOW,
    labelled,
    read_summary,
)
from allocator.trainer.jobs.walk_forward.window import WindowJob, span_setup, window_baselines
from allocator.trainer.training.config import load_config
from allocator.trainer.training.run_dir import CONFIG_FILE


def located(recorded: str, fallback: Path) -> Path:
    """A recorded absolute path when it still exists, else where the run's layout puts it."""
    path = Path(recorded) if recorded else fallback
    if path.exists():
        return path
    if fallback.exists():
        return fallback
    raise WalkForwardError(f"neither {recorded} nor {fallback} exists: cannot replay this window")


def rebuilt_job(run: Path, summary: dict[str, Any], entry: dict[str, Any]) -> WindowJob:
    """The ``WindowJob`` a window ran as, from ``summary.json`` and its training run's
    resolved ``config.yaml``."""
    window = window_from(entry)
    run_dir = located(entry.get("run_dir", ""), run / "runs" / window.label)
    trainer = load_config(run_dir / CONFIG_FILE)
    return WindowJob(
        window=window,
        trainer=trainer,
        run_dir=str(run_dir),
        registry=summary["registry"],
        model_name=summary["model_name"],
        version=entry["version"],
        cost_bps=float(summary["cost_bps"]),
        baselines=tuple(summary["baselines"]),
        baseline_fit=summary["baseline_fit"],
        rebalance_every=int(summary["baseline_rebalance_every"]),
        torch_threads=1,
    )


def with_baselines(run_dir: str | Path, frame: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """``frame`` (the run's daily returns) with a column for each of ``names`` it lacks,
    backtested on every window's test span with the assets and costs its model was judged on.

    The new columns must cover exactly the recorded days: a day missing on either side means
    the span was not rebuilt as the run saw it, and that is an error, not a silent gap.
    """
    missing = [n for n in dict.fromkeys(names) if n not in frame.columns]
    if not missing:
        return frame
    run = Path(run_dir)
    summary = read_summary(run)
    parts = []
    for entry in summary["windows"]:
        job = replace(rebuilt_job(run, summary, entry), baselines=tuple(missing))
        registry_dir = Path(summary["registry"]) / summary["model_name"] / entry["version"]
        _, data, assets = span_setup(job, located(entry.get("version_dir", ""), registry_dir))
        results = window_baselines(job, data, assets)
        returns = pd.DataFrame({n: results[n].returns for n in missing})
        parts.append(labelled(returns, job.window.label))
    added = pd.concat(parts, ignore_index=True)
    keys = [DATE, WINDOW]
    check = frame[keys].merge(added[keys], how="outer", indicator=True, validate="one_to_one")
    unmatched = check[check["_merge"] != "both"]
    if len(unmatched):
        first = unmatched.iloc[0]
        side = "recorded only" if first["_merge"] == "left_only" else "rebuilt only"
        raise WalkForwardError(
            f"{run}: {', '.join(missing)} rebuilt on other days than the run recorded "
            f"({len(unmatched)} day(s), first {first[DATE]:%Y-%m-%d} in {first[WINDOW]}, "
            f"{side}); the data or the run's config changed since"
        )
    return frame.merge(added, on=keys, how="left", validate="one_to_one")
