"""One walk-forward window as a job: train on its training span, export, judge on its test span.

Absolute paths throughout: a Ray worker may run it on another machine. Run again (a retry,
``--resume``), a window redoes only what is missing, continuing a cut-short training run from its
last checkpoint when it has one; a registry version is never overwritten."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from allocator.artifacts.manifest import ManifestError, read_manifest, verify_checksums
from allocator.serving.loader import LoadedModel, load_model
from allocator.trainer.export.run import export_run
from allocator.trainer.jobs.evaluation import (
    BaselineFit,
    ExportedEvaluation,
    evaluate_baselines,
    evaluation_assets,
    icm_statistics,
    replay_exported,
)
from allocator.trainer.jobs.json_safe import read_json_object
from allocator.trainer.jobs.walk_forward.config import WalkForwardConfig, WalkForwardError
from allocator.trainer.jobs.walk_forward.progress import (
    EVALUATED,
    EVALUATING,
    EXPORTING,
    STARTING,
    ProgressCallback,
    write_progress,
)
from allocator.trainer.jobs.walk_forward.rundir import (
    AGENT,
    DATE,
    RUNS_DIR,
    WINDOW,
    WindowResult,
    labelled,
    read_summary,
    window_from,
)
from allocator.trainer.market.data import (
    DATABASE,
    SP500,
    MarketData,
    check_price_database,
    load_dataset,
)
from allocator.trainer.market.windows import Window, make_windows
from allocator.trainer.sim.backtest import BacktestResult
from allocator.trainer.training.checkpointing import latest_checkpoint
from allocator.trainer.training.config import TrainConfig, load_config
from allocator.trainer.training.run import resume, train
from allocator.trainer.training.run_dir import CONFIG_FILE, RUN_SUMMARY_FILE
from allocator.trainer.training.tracking import TrackedRun
from allocator.typed_config import ConfigError


@dataclass(frozen=True)
class WindowJob:
    """Everything a worker needs for one window."""

    window: Window
    trainer: TrainConfig
    run_dir: str
    registry: str
    model_name: str
    version: str
    cost_bps: float
    baselines: tuple[str, ...]
    baseline_fit: BaselineFit
    rebalance_every: int
    torch_threads: int
    progress_every: int = 1000

    @property
    def version_dir(self) -> Path:
        """Where the window's export is published: ``REGISTRY/NAME/VERSION``."""
        return Path(self.registry) / self.model_name / self.version


def universe(trainer: TrainConfig) -> MarketData:
    """The trainer's dataset restricted to its asset list (all assets when it has none)."""
    data = load_dataset(trainer.data.dataset, as_of=trainer.data.as_of)
    return data.select(trainer.data.assets) if trainer.data.assets else data


def window_trainer_config(config: WalkForwardConfig, window: Window, run_root: Path) -> TrainConfig:
    """The trainer config of one window: its spans, its seed, quiet, one torch setting."""
    base = config.trainer.model_dump(mode="json")
    seed = (config.trainer.seed if config.seed is None else config.seed) + window.index
    dataset = base["data"]["dataset"]
    if dataset not in (SP500, DATABASE) and not Path(dataset).is_absolute():
        dataset = str(Path(dataset).resolve())
    base.update(
        name=f"{config.trainer.name}-{window.label}",
        seed=seed,
        torch_threads=config.torch_threads,
        output_dir=str(run_root),
        progress_bar=False,
        html_report=False,  # the walk-forward's own report.html covers every window
    )
    base["data"].update(
        dataset=dataset,
        train_start=str(window.train_start),
        train_end=str(window.train_end),
        validation_start=str(window.test_start),
        validation_end=str(window.test_end),
    )
    return TrainConfig.model_validate(base)


def plan(config: WalkForwardConfig, out_dir: Path, label: str) -> list[WindowJob]:
    """The windows over the trainer's data and one job per window."""
    check_price_database(config.trainer.data.dataset, config.database_url)
    windows = make_windows(universe(config.trainer).dates, config.windows)
    registry = str(Path(config.registry).resolve())
    run_root = (out_dir / RUNS_DIR).resolve()
    return [
        WindowJob(
            window=w,
            trainer=window_trainer_config(config, w, run_root),
            run_dir=str(run_root / w.label),
            registry=registry,
            model_name=config.model_name,
            version=f"wf-{label}-{w.label}",
            cost_bps=config.cost_bps,
            baselines=tuple(config.baselines),
            baseline_fit=config.baseline_fit,
            rebalance_every=config.baseline_rebalance_every,
            torch_threads=config.torch_threads,
            progress_every=config.progress_every,
        )
        for w in windows
    ]


def plan_payload(jobs: Sequence[WindowJob]) -> dict[str, Any]:
    """What the config cut from the data: the registry, the dataset, the windows."""
    return {
        "registry": jobs[0].registry if jobs else None,
        "dataset": jobs[0].trainer.data.dataset if jobs else None,
        "windows": [j.window.to_dict() for j in jobs],
    }


def nested(jobs: Sequence[WindowJob], parent: TrackedRun | None) -> list[WindowJob]:
    """``jobs`` with each training run tracked as a child of ``parent`` (MLflow); the parent's
    id travels in the trainer config, so every executor nests them."""
    if parent is None:
        return list(jobs)
    return [
        replace(
            job,
            trainer=job.trainer.model_copy(
                update={"tracking": parent.child_settings(job.trainer.tracking)}
            ),
        )
        for job in jobs
    ]


def whole(directory: Path) -> bool:
    """A manifest whose every file matches its checksum: a training run or registry version is
    trusted only then (anything less was cut short)."""
    try:
        verify_checksums(directory, read_manifest(directory))
    except (ManifestError, OSError):
        return False
    return True


def finished_training(run_dir: str | Path) -> dict[str, Any] | None:
    """The ``run.json`` of a training run that finished (its manifest whole), else None."""
    run = Path(run_dir)
    return read_json_object(run / RUN_SUMMARY_FILE) if whole(run) else None


def run_window(job: WindowJob) -> WindowResult:
    """Train on the window's training span, export, then evaluate on its test span."""
    started = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(job.torch_threads)  # the same in every executor: same float sums
    try:
        cfg, w = job.trainer, job.window
        summary = finished_training(job.run_dir)
        if summary is None or not whole(job.version_dir):
            summary = train_and_export(job, summary)
        write_progress(job.run_dir, w.label, EVALUATING)
        model, data, assets = span_setup(job, job.version_dir)
        agent = replay_exported(
            model, data, w.test_start, w.test_end, cost_bps=job.cost_bps, assets=assets, name=AGENT
        )
        baselines = window_baselines(job, data, assets)
        icm = window_icm_statistics(job, model, data, agent)
    finally:
        torch.set_num_threads(threads)  # the local executor runs in the caller's process
    result = WindowResult(
        window=job.window,
        version=job.version,
        version_dir=str(job.version_dir),
        run_dir=job.run_dir,
        algorithm=cfg.algorithm.name,
        manifest=model.manifest.model_dump(mode="json"),
        agent=agent.result,
        baselines=baselines,
        icm=icm,
        torch_validation=summary["validation"].get(cfg.algorithm.name, {}),
        train_seconds=float(summary["train_seconds"]),
        seconds=time.perf_counter() - started,
        resumed_from=[int(step) for step in summary.get("resumed_from", [])],
    )
    write_progress(job.run_dir, w.label, EVALUATED)
    return result


def train_and_export(job: WindowJob, trained: dict[str, Any] | None) -> dict[str, Any]:
    """Train (unless ``trained``, a whole run's summary, is given) and export; the run's summary.

    Refused when the version already exists: versions are final."""
    run_dir = Path(job.run_dir)
    if job.version_dir.exists():
        raise WalkForwardError(
            f"{job.version_dir} exists, but window {job.window.label} cannot reuse it (its "
            f"training run {run_dir} or the version is not whole): registry versions are "
            "never overwritten; remove the version to train this window again"
        )
    if trained is None:
        label, cfg = job.window.label, job.trainer
        progress = ProgressCallback(run_dir, label, cfg.total_timesteps, job.progress_every)
        step = checkpoint_step(run_dir) if cfg.checkpoint_every else None
        if step is not None:
            write_progress(run_dir, label, STARTING, resumed_from=step)
            trained = resume(run_dir, cfg, callbacks=[progress]).summary
        else:
            if run_dir.exists():
                shutil.rmtree(run_dir)
            write_progress(run_dir, label, STARTING)  # data and model before step 0
            trained = train(cfg, run_dir, callbacks=[progress]).summary
    write_progress(run_dir, job.window.label, EXPORTING)
    export_run(run_dir, job.registry, name=job.model_name, version=job.version)
    return trained


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of the last checkpoint of a training run that did not finish, else None."""
    if not run_dir.is_dir() or (run_dir / RUN_SUMMARY_FILE).exists():
        return None  # nothing there, or a run that got as far as finishing: start over
    try:
        return latest_checkpoint(run_dir).num_timesteps
    except ConfigError:
        return None


def span_setup(
    job: WindowJob, version_dir: str | Path
) -> tuple[LoadedModel, MarketData, list[str]]:
    """The window's exported model, its data and the assets it is judged on."""
    w, model = job.window, load_model(version_dir, prefer_cuda=False)
    data = universe(job.trainer)
    window = job.trainer.env.window
    return model, data, evaluation_assets(data, w.test_start, w.test_end, window, model.max_assets)


def window_baselines(
    job: WindowJob, data: MarketData, assets: list[str]
) -> dict[str, BacktestResult]:
    """The baselines on the test span; fitted ones see the training span (``baseline_fit``)."""
    w = job.window
    return evaluate_baselines(
        data,
        w.test_start,
        w.test_end,
        cost_bps=job.cost_bps,
        assets=assets,
        names=job.baselines,
        fit=job.baseline_fit,
        train_start=w.train_start,
        train_end=w.train_end,
        window=job.trainer.env.window,
        rebalance_every=job.rebalance_every,
        anchor=job.trainer.env.action.tilt_anchor,
    )


def window_icm_statistics(
    job: WindowJob, model: LoadedModel, data: MarketData, ev: ExportedEvaluation
) -> dict[str, float] | None:
    """Curiosity on the test span against as many decisions at the end of the training span
    (novelty is the ratio, not the raw reward); None without an ICM graph."""
    if model.icm_session is None:
        return None
    w, window = job.window, job.trainer.env.window
    lo = data.date_index(w.train_start, "left")
    hi = data.date_index(w.train_end, "right")
    ref_start = data.dates[max(lo + window, hi - len(ev.icm_rewards))]
    ref = replay_exported(model, data, ref_start, w.train_end, cost_bps=job.cost_bps)
    return icm_statistics(ev.icm_rewards, ref.icm_rewards)


def located(recorded: str, fallback: Path) -> Path:
    """A recorded absolute path when it still exists, else where the run's layout puts it."""
    path = Path(recorded) if recorded else fallback
    if path.exists():
        return path
    if fallback.exists():
        return fallback
    raise WalkForwardError(f"neither {recorded} nor {fallback} exists: cannot replay this window")


def rebuilt_job(
    run: Path, summary: dict[str, Any], entry: dict[str, Any], baselines: Sequence[str]
) -> WindowJob:
    """The ``WindowJob`` a window ran as, judging ``baselines``, from the run's files."""
    window = window_from(entry)
    run_dir = located(entry.get("run_dir", ""), run / RUNS_DIR / window.label)
    return WindowJob(
        window=window,
        trainer=load_config(run_dir / CONFIG_FILE),
        run_dir=str(run_dir),
        registry=summary["registry"],
        model_name=summary["model_name"],
        version=entry["version"],
        cost_bps=float(summary["cost_bps"]),
        baselines=tuple(baselines),
        baseline_fit=summary["baseline_fit"],
        rebalance_every=int(summary["baseline_rebalance_every"]),
        torch_threads=1,
    )


def with_baselines(run_dir: str | Path, frame: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """``frame`` (the run's daily returns) with a column for each of ``names`` it lacks, backtested
    as its model was judged; a day rebuilt differently than recorded is an error, not a gap."""
    missing = [n for n in dict.fromkeys(names) if n not in frame.columns]
    if not missing:
        return frame
    run = Path(run_dir)
    summary = read_summary(run)
    parts = []
    for entry in summary["windows"]:
        job = rebuilt_job(run, summary, entry, missing)
        _, data, assets = span_setup(job, located(entry.get("version_dir", ""), job.version_dir))
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
