"""The tuning driver: ask the study for trials, train them on the executor, tell the results.

Only the driver draws values (seeded TPE); an interrupted study marks its running trials failed
and still writes its files."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState
from tqdm.auto import tqdm

from allocator.trainer.jobs.executors import (
    Executor,
    ExecutorSettings,
    WorkerLostError,
    open_executor,
)
from allocator.trainer.jobs.run_folder import make_label, run_directory
from allocator.trainer.jobs.tuning.config import TuneConfig, TuneError
from allocator.trainer.jobs.tuning.objective import TrialJob, TrialOutcome, run_trial
from allocator.trainer.jobs.tuning.results import write_results
from allocator.trainer.jobs.tuning.space import SearchSpace, tuned_config
from allocator.trainer.jobs.tuning.study import STORAGE_FILE, create_study
from allocator.trainer.training.inputs import prepare_data
from allocator.trainer.training.tracking import (
    TrackedRun,
    ended_on_error,
    log_job_finished,
    open_job_run,
)
from allocator.typed_config import ConfigError

TRIALS_DIR = "trials"

Trials = Executor[TrialJob, TrialOutcome]


def trial_label(job: TrialJob) -> str:
    return f"trial {job.number}"


def next_outcome(executor: Trials) -> TrialOutcome:
    """The next trial to finish; one whose worker died is failed and the study goes on."""
    try:
        return executor.next_done()
    except WorkerLostError as lost:
        job = lost.job
        assert isinstance(job, TrialJob)
        cause = lost.__cause__
        error = f"{type(cause).__name__}: {cause}".splitlines()[0]
        return TrialOutcome.failed(job.number, error, str(job.run_dir))


@dataclass(frozen=True)
class TuneResult:
    """Where a study went and what it found (``summary`` is ``tune.json``)."""

    config: TuneConfig
    out_dir: Path
    summary: dict[str, Any]
    files: dict[str, str]
    seconds: float

    @property
    def best(self) -> dict[str, Any] | None:
        return self.summary["best"]


def trial_job(
    config: TuneConfig,
    space: SearchSpace,
    trial: optuna.Trial,
    out: Path,
    parent: TrackedRun | None = None,
) -> TrialJob:
    """Draw the trial's values and build its job (tracked under ``parent`` when given)."""
    tuned = tuned_config(config.trainer, space.suggest(trial))
    threads = config.torch_threads or (1 if config.executor == "ray" else tuned.torch_threads)
    tracking = parent.child_settings(tuned.tracking) if parent is not None else tuned.tracking
    run_config = tuned.model_copy(
        update={
            "tracking": tracking,
            "name": f"{config.name}-trial{trial.number:04d}",
            "output_dir": str(out / TRIALS_DIR),
            "progress_bar": False,
            "tensorboard": False,
            "html_report": False,
            "torch_threads": threads,
            "checkpoint_every": 0,
        }
    )
    return TrialJob(
        number=trial.number,
        config=run_config,
        run_dir=out / TRIALS_DIR / f"trial-{trial.number:04d}",
        storage=str(out / STORAGE_FILE),
        study_name=config.name,
        pruner=config.pruner,
    )


def tell(study: optuna.Study, trial: optuna.Trial, outcome: TrialOutcome) -> None:
    """Record the outcome: its figures as user attributes, then its state and value."""
    for key, value in outcome.attrs().items():
        trial.set_user_attr(key, value)
    if outcome.state == "COMPLETE":
        study.tell(trial, outcome.value)
    else:
        study.tell(trial, state=TrialState[outcome.state])


@dataclass
class Driver:
    """One study's loop over its executor: what was started, what runs, why it stopped."""

    config: TuneConfig
    space: SearchSpace
    study: optuna.Study
    out: Path
    on_done: Callable[[TrialOutcome], None]
    tracked: TrackedRun | None = None  # the MLflow run the trials' runs nest under
    started: float = field(default_factory=time.perf_counter)
    asked: int = 0
    failures_in_a_row: int = 0
    stopped: str | None = None
    running: dict[int, optuna.Trial] = field(default_factory=dict)

    def may_start(self) -> bool:
        c = self.config
        elapsed = time.perf_counter() - self.started
        if self.stopped is None and c.timeout_s is not None and elapsed >= c.timeout_s:
            self.stopped = f"timeout_s ({c.timeout_s:g} s) reached"
        return self.stopped is None and self.asked < c.n_trials

    def start(self, executor: Trials) -> None:
        """Ask for trials while the executor has room and the budget allows."""
        while executor.running < executor.capacity and self.may_start():
            trial = self.study.ask()
            self.asked += 1
            self.running[trial.number] = trial  # from now on an interruption fails it
            try:
                job = trial_job(self.config, self.space, trial, self.out, self.tracked)
            except ConfigError as exc:  # values valid one by one, refused together
                self.running.pop(trial.number)
                self.finish(trial, TrialOutcome.failed(trial.number, str(exc).replace("\n", " ")))
                continue
            executor.submit(job)

    def finish(self, trial: optuna.Trial, outcome: TrialOutcome) -> None:
        tell(self.study, trial, outcome)
        self.failures_in_a_row = self.failures_in_a_row + 1 if outcome.state == "FAIL" else 0
        if self.failures_in_a_row >= self.config.stop_after_failures and self.stopped is None:
            self.stopped = (
                f"{self.failures_in_a_row} failed trials in a row (last: {outcome.error})"
            )
        self.on_done(outcome)

    def run(self, executor: Trials) -> None:
        """Start, wait for one, repeat, until nothing runs and nothing may start."""
        try:
            while True:
                self.start(executor)
                if executor.running == 0:
                    return
                outcome = next_outcome(executor)
                self.finish(self.running.pop(outcome.number), outcome)
        except BaseException as exc:
            for number, trial in list(self.running.items()):
                tell(self.study, trial, TrialOutcome.failed(number, repr(exc)))
            self.running.clear()
            raise


def run_tuning(
    config: TuneConfig, *, out_dir: str | Path | None = None, progress: bool = True
) -> TuneResult:
    """Run the study on the configured executor; write trials.csv, best.yaml and tune.json."""
    space = config.search_space()  # before any folder or trial: a bad key fails here
    prepare_data(tuned_config(config.trainer, {}))  # and data or an inner span that cannot work
    label = make_label()
    out = run_directory(config.output_dir, config.name, out_dir, label)
    if (out / STORAGE_FILE).exists():
        raise TuneError(f"{out} already holds a study ({STORAGE_FILE}); choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    study = create_study(out / STORAGE_FILE, config)
    if config.enqueue_base:
        study.enqueue_trial(space.base_params)
    bar = tqdm(total=config.n_trials, desc="tune", unit="trial", disable=not progress)

    def done(outcome: TrialOutcome) -> None:
        value = "-" if outcome.value is None else f"{outcome.value:+.3f}"
        bar.set_postfix_str(f"trial {outcome.number} {outcome.state.lower()} {value}")
        bar.update()

    name = f"{config.name}-{label}"
    tracked = open_job_run(config.trainer.tracking, out, name, config.model_dump(mode="json"))
    driver = Driver(config, space, study, out, done, tracked)
    capacity = 1
    try:
        where = ExecutorSettings(
            executor=config.executor,
            workers=config.parallel,
            ray_address=config.ray_address,
            retries=0,
        )
        trials = open_executor(where, run_trial, trial_label)
        with ended_on_error(tracked), trials as executor:
            capacity = executor.capacity
            driver.run(executor)
    finally:
        bar.close()
        seconds = time.perf_counter() - driver.started
        facts = {
            "label": label,
            "study": {"name": config.name, "storage": str(out / STORAGE_FILE)},
            "executor": config.executor,
            "parallel": capacity,
            "stopped": driver.stopped,
            "seconds": round(seconds, 2),
        }
        summary, files = write_results(out, config, space, study.get_trials(deepcopy=False), facts)
    if tracked is not None:
        log_job_finished(tracked, summary, [Path(f) for f in files.values()])
    return TuneResult(config, out, summary, files, seconds)
