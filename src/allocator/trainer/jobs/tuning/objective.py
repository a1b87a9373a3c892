"""One trial: train the tuned config with selection, report inner scores, return the best one.

No validation backtest runs, so no price after ``data.train_end`` can move a trial's value."""

from __future__ import annotations

import json
import math
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import optuna
from stable_baselines3.common.callbacks import BaseCallback

from allocator.trainer.jobs.json_safe import finite
from allocator.trainer.jobs.tuning.config import PrunerSettings
from allocator.trainer.jobs.tuning.study import attach_trial
from allocator.trainer.training.config import TrainConfig
from allocator.trainer.training.run import TrainingSession
from allocator.trainer.training.run_dir import SELECTION_FILE
from allocator.trainer.training.selection import SelectionCallback
from allocator.trainer.training.tracking import ended_on_error, log_trial

ERROR_FILE = "error.txt"

TrialState = Literal["COMPLETE", "PRUNED", "FAIL"]


@dataclass(frozen=True)
class TrialJob:
    """Everything a worker needs to train one trial (picklable, for Ray)."""

    number: int
    config: TrainConfig  # the base config with the trial's values, selection on, housekeeping
    run_dir: Path
    storage: str  # the study's journal file
    study_name: str
    pruner: PrunerSettings


@dataclass(frozen=True)
class TrialOutcome:
    """What a trial reached: its state, value (best inner score), steps and time."""

    number: int
    state: TrialState
    value: float | None
    steps: int
    seconds: float
    best_step: int | None
    evaluations: int
    run_dir: str
    error: str | None = None

    @classmethod
    def failed(
        cls, number: int, error: str, run_dir: str = "", seconds: float = 0.0
    ) -> TrialOutcome:
        """A trial that reached nothing: it raised, its worker died, or it never started."""
        return cls(number, "FAIL", None, 0, seconds, None, 0, run_dir, error)

    def attrs(self) -> dict[str, Any]:
        """The figures stored with the trial in the study (Optuna user attributes)."""
        rest = {k: v for k, v in asdict(self).items() if k not in ("number", "state", "value")}
        return {"best_score": self.value, **rest}


class PruningCallback(BaseCallback):
    """Reports every inner evaluation to ``trial``; stops training once the pruner says so, by
    ``_on_step`` returning False as SB3's stopping callbacks do, rather than raising through
    ``learn``."""

    def __init__(self, selection: SelectionCallback, trial: optuna.Trial) -> None:
        super().__init__()
        self.selection = selection
        self.trial = trial
        self.reported = 0
        self.pruned_at: int | None = None

    @property
    def pruned(self) -> bool:
        return self.pruned_at is not None

    def _on_step(self) -> bool:
        return not self.report()

    def report(self) -> bool:
        """Report the evaluations not reported yet; True when the trial is to be pruned."""
        evaluations = self.selection.state.evaluations
        new = evaluations[self.reported :]
        self.reported = len(evaluations)
        for evaluation in new:
            if math.isfinite(evaluation["score"]):  # NaN (no trades, no variance) is no signal
                self.trial.report(float(evaluation["score"]), int(evaluation["step"]))
        if new and self.pruned_at is None and self.trial.should_prune():
            self.pruned_at = int(new[-1]["step"])
        return self.pruned


def train_trial(job: TrialJob) -> tuple[int, bool]:
    """Train with pruning; the steps trained and whether the pruner stopped the trial."""
    trial = attach_trial(job.storage, job.study_name, job.number, job.pruner)
    session = TrainingSession.start(job.config, job.run_dir)
    selection = session.selection
    assert selection is not None, "a trial trains with selection enabled"
    pruning = PruningCallback(selection, trial)
    session.callbacks.append(pruning)  # after SelectionCallback: it reads that evaluation
    with ended_on_error(session.tracked):
        session.learn()
        steps = int(session.model.num_timesteps)
        if not pruning.pruned and selection.state.last_eval_step != steps:
            selection.evaluate()  # the last policy gets its score too, as a finished run's does
            pruning.report()
        if session.tracked is not None:
            log_trial(session.tracked, job.run_dir, selection.summary(steps), steps, pruning.pruned)
    return steps, pruning.pruned


def interruption(exc: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM behind ``exc``, if any. Optuna's journal lock, interrupted while it
    takes or frees the lock, frees it again and raises an ``OSError`` or ``RuntimeError`` in
    place of the interruption, which must stop the study rather than fail one trial."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


def run_trial(job: TrialJob) -> TrialOutcome:
    """Train one trial and read its value from its ``selection.json``. A failed trial comes back
    as ``FAIL`` (traceback in ``error.txt``), so one bad region of the space does not end the
    study; only an interruption raises."""
    started = time.perf_counter()
    job.run_dir.mkdir(parents=True, exist_ok=True)
    try:
        steps, pruned = train_trial(job)
    except Exception as exc:
        if (stopped := interruption(exc)) is not None:
            raise stopped from None  # its own traceback: where the signal landed
        (job.run_dir / ERROR_FILE).write_text(traceback.format_exc())
        seconds = round(time.perf_counter() - started, 2)
        return TrialOutcome.failed(
            job.number, f"{type(exc).__name__}: {exc}", str(job.run_dir), seconds
        )
    selection = json.loads((job.run_dir / SELECTION_FILE).read_text())
    value = finite(selection["best_score"])
    state: TrialState = "PRUNED" if pruned else "COMPLETE"
    error: str | None = None
    if value is None and not pruned:
        state, error = "FAIL", f"no finite inner {selection['metric']} in any evaluation"
    return TrialOutcome(
        number=job.number,
        state=state,
        value=value,
        steps=steps,
        seconds=round(time.perf_counter() - started, 2),
        best_step=selection["best_step"],
        evaluations=len(selection["evaluations"]),
        run_dir=str(job.run_dir),
        error=error,
    )
