"""Reporting a trial's inner scores to Optuna; a pruned trial stops by ``_on_step`` returning False,
as SB3's stopping callbacks do, rather than raising through ``learn``."""

from __future__ import annotations

import math

import optuna
from stable_baselines3.common.callbacks import BaseCallback

from allocator.trainer.training.selection import SelectionCallback


class PruningCallback(BaseCallback):
    """Reports every inner evaluation to ``trial``; stops training once the pruner says so."""

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
