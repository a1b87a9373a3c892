"""Daily returns of a run made before ``returns.csv`` existed, rebuilt by replaying it.

``rebuild_returns`` judges each window's exported version again on its test span, through the
very function the window used (``window.evaluate_test_span``: the ONNX graph replayed through
the serving path, the baselines on the same assets and costs), from what ``summary.json`` and
the window's training run directory (its resolved ``config.yaml``) record. It only reads the
run directory: the rebuilt frame is returned, never written there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from allocator.trainer.jobs.walk_forward.config import WalkForwardConfig, WalkForwardError
from allocator.trainer.jobs.walk_forward.results import policy_returns
from allocator.trainer.jobs.walk_forward.returns import (
    RETURNS_FILE,
    SUMMARY_FILE,
    labelled,
    read_returns,
    read_summary,
)
from allocator.trainer.jobs.walk_forward.window import WindowJob, evaluate_test_span
from allocator.trainer.market.windows import Window
from allocator.trainer.training.config import load_config
from allocator.trainer.training.run_dir import CONFIG_FILE


def load_returns(run_dir: str | Path) -> tuple[pd.DataFrame, str]:
    """A run's daily returns and where they came from: its ``returns.csv``, else rebuilt."""
    path = Path(run_dir) / RETURNS_FILE
    if path.is_file():
        return read_returns(path), str(path)
    return rebuild_returns(run_dir), "rebuilt by replaying each window's exported model"


def rebuild_returns(run_dir: str | Path) -> pd.DataFrame:
    """Judge every window of a finished run again on its test span (reads only)."""
    run = Path(run_dir)
    summary = read_summary(run)
    frames = []
    for entry in summary["windows"]:
        job = rebuilt_job(run, summary, entry)
        registry_dir = Path(summary["registry"]) / summary["model_name"] / entry["version"]
        test = evaluate_test_span(job, located(entry.get("version_dir", ""), registry_dir))
        returns = policy_returns(test.agent.result, test.baselines)
        frames.append(labelled(returns, job.window.label))
    if not frames:
        raise WalkForwardError(f"{run / SUMMARY_FILE} lists no windows")
    return pd.concat(frames, ignore_index=True)


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
    resolved ``config.yaml``; what older summaries lack takes the config's default."""
    defaults = WalkForwardConfig.model_fields
    window = Window(
        entry["index"],
        *(
            pd.Timestamp(entry[k]).date()
            for k in ("train_start", "train_end", "test_start", "test_end")
        ),
    )
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
        baselines=tuple(summary.get("baselines") or entry["baselines"]),
        baseline_fit=summary.get("baseline_fit", defaults["baseline_fit"].default),
        rebalance_every=int(
            summary.get("baseline_rebalance_every", defaults["baseline_rebalance_every"].default)
        ),
        torch_threads=1,
    )
