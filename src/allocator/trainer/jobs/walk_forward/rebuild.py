"""Daily returns of a run made before ``returns.csv`` existed, rebuilt by replaying it.

``rebuild_returns`` judges each window's exported version again on its test span, through the
very function the window used (``window.evaluate_test_span``: the ONNX graph replayed through
the serving path, the baselines on the same assets and costs), from what ``summary.json`` and
the window's training run directory (its resolved ``config.yaml``) record. It only reads the
run directory: the rebuilt frame is returned, never written there.

``with_baselines`` answers a question asked after a run: how it fares against a baseline it
did not run with (``allocator walk-forward stats --baseline anchor``). Each window's test span
is backtested for that baseline alone, on the assets and costs the window's model was judged
on, and joined to the recorded returns, which are left as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from allocator.serving.loader import load_model
from allocator.trainer.jobs.evaluation import evaluation_assets
from allocator.trainer.jobs.walk_forward.config import WalkForwardConfig, WalkForwardError
from allocator.trainer.jobs.walk_forward.results import policy_returns
from allocator.trainer.jobs.walk_forward.returns import (
    DATE,
    RETURNS_FILE,
    SUMMARY_FILE,
    WINDOW,
    labelled,
    read_returns,
    read_summary,
)
from allocator.trainer.jobs.walk_forward.window import (
    WindowJob,
    evaluate_test_span,
    universe,
    window_baselines,
)
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
        model = load_model(located(entry.get("version_dir", ""), registry_dir), prefer_cuda=False)
        data = universe(job.trainer)
        w = job.window
        assets = evaluation_assets(
            data, w.test_start, w.test_end, job.trainer.env.window, model.max_assets
        )
        results = window_baselines(job, data, assets)
        parts.append(labelled(pd.DataFrame({n: results[n].returns for n in missing}), w.label))
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
