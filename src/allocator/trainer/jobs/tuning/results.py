"""What a study leaves next to its journal: ``trials.csv``, ``best.yaml`` (the best trial's full
trainer config) and ``tune.json`` (what was searched, on which dates, and how many
configurations were tried: what a deflated Sharpe of the chosen one must be told)."""

from __future__ import annotations

import csv
import io
import json
import statistics
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from allocator.artifacts.files import atomic_write_text, write_json
from allocator.trainer.jobs.tuning.config import TuneConfig
from allocator.trainer.jobs.tuning.space import SearchSpace, tuned_config
from allocator.trainer.training.config import dump_config
from allocator.trainer.training.run_dir import SELECTION_FILE

TRIALS_FILE = "trials.csv"
BEST_FILE = "best.yaml"
SUMMARY_FILE = "tune.json"

ATTRS = ("best_score", "steps", "seconds", "best_step", "evaluations", "run_dir", "error")
"""The user attributes each trial carries (``TrialOutcome.attrs``), as trials.csv columns."""


def best_trial(trials: list[FrozenTrial]) -> FrozenTrial | None:
    """The completed trial with the highest value (the earliest of equals), if any."""
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    return max(done, key=lambda t: (t.value, -t.number)) if done else None


def write_trials(path: Path, trials: list[FrozenTrial], space: SearchSpace) -> None:
    """One row per trial: number, state, value, the drawn values, steps, seconds, run dir."""
    keys = [p.key for p in space.params]
    columns = ["number", "state", "value", *[f"params.{k}" for k in keys], *ATTRS]

    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    for t in sorted(trials, key=lambda t: t.number):
        row: dict[str, Any] = {"number": t.number, "state": t.state.name, "value": t.value}
        row.update({f"params.{k}": t.params.get(k) for k in keys})
        row.update({a: t.user_attrs.get(a) for a in ATTRS})
        writer.writerow(row)
    atomic_write_text(path, text.getvalue())


def write_best(path: Path, config: TuneConfig, space: SearchSpace, best: FrozenTrial) -> None:
    """The best trial's full trainer config, with the base config's name and output folder."""
    tuned = tuned_config(config.trainer, space.decode(best.params))
    header = (
        f"# Best trial of tuning study {config.name!r}: trial {best.number},\n"
        f"# inner {tuned.selection.metric} {best.value:.6g} (scored inside the training span).\n"
        f"# Every key of the base config, with the tuned values; train it with\n"
        f"#   allocator train --config {path.name}\n"
    )
    atomic_write_text(path, header + dump_config(tuned))


def inner_span(trials: list[FrozenTrial]) -> dict[str, Any] | None:
    """The training span's cut (the same for every trial), from a trial's selection.json."""
    for t in sorted(trials, key=lambda t: t.number):
        run_dir = t.user_attrs.get("run_dir")
        if run_dir and (Path(run_dir) / SELECTION_FILE).is_file():
            return json.loads((Path(run_dir) / SELECTION_FILE).read_text())["split"]
    return None


def sharpe_variance(config: TuneConfig, trials: list[FrozenTrial]) -> float | None:
    """Sample variance of the completed trials' inner Sharpe ratios (annualized), when the
    objective is the Sharpe ratio: walk-forward's ``statistics.trials_sharpe_variance``."""
    values = [t.value for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    if config.trainer.selection.metric != "sharpe" or len(values) < 2:
        return None
    return statistics.variance(values)


def summarize(
    config: TuneConfig,
    space: SearchSpace,
    trials: list[FrozenTrial],
    facts: dict[str, Any],
) -> dict[str, Any]:
    """``tune.json``: the study, its budget, every state's count, the best trial, the dates."""
    best = best_trial(trials)
    data = config.trainer.data
    states = {s.name: sum(t.state == s for t in trials) for s in TrialState}
    return {
        "name": config.name,
        **facts,
        "objective": f"best inner {config.trainer.selection.metric} of a trial's run "
        "(best_score in its selection.json), maximized",
        "n_trials": len(trials),
        "configurations_tried": len(trials),
        "states": {k: v for k, v in states.items() if v},
        "budget": {"n_trials": config.n_trials, "timeout_s": config.timeout_s},
        "best": None
        if best is None
        else {
            "number": best.number,
            "value": best.value,
            "params": space.decode(best.params),
            "run_dir": best.user_attrs.get("run_dir"),
        },
        "trials_sharpe_variance": sharpe_variance(config, trials),
        "data": {
            "train_start": str(data.train_start),
            "train_end": str(data.train_end),
            "inner_span": inner_span(trials),
            "last_date_seen": str(data.train_end),
        },
        "space": {k: v.model_dump(exclude_defaults=True) for k, v in config.space.items()},
        "sampler": config.sampler.model_dump(),
        "pruner": config.pruner.model_dump(),
        "trainer_source": config.trainer_source,
    }


def write_results(
    out: Path,
    config: TuneConfig,
    space: SearchSpace,
    trials: list[FrozenTrial],
    facts: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, str]]:
    """Write trials.csv, tune.json and (when a trial completed) best.yaml into ``out``."""
    files = {"trials": out / TRIALS_FILE, "summary": out / SUMMARY_FILE}
    write_trials(files["trials"], trials, space)
    best = best_trial(trials)
    if best is not None:
        files["best"] = out / BEST_FILE
        write_best(files["best"], config, space, best)
    summary = summarize(config, space, trials, facts)
    write_json(files["summary"], summary)
    return summary, {k: str(v) for k, v in files.items()}
