"""The Optuna study on disk, shared by driver and trials: a journal file (append-only, file-locked,
no database server) that a trial in any process or Ray worker opens to report its inner scores,
so the pruner compares it with every other trial wherever those ran."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.pruners import (
    BasePruner,
    MedianPruner,
    NopPruner,
    SuccessiveHalvingPruner,
    ThresholdPruner,
)
from optuna.samplers import RandomSampler, TPESampler
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from allocator.trainer.jobs.tuning.config import PrunerSettings, TuneConfig

STORAGE_FILE = "study.journal"

PRUNERS: dict[str, type[BasePruner]] = {
    "median": MedianPruner,
    "halving": SuccessiveHalvingPruner,
    "threshold": ThresholdPruner,
    "none": NopPruner,
}
"""Optuna's pruner for each ``pruner.kind``; the other settings are its keyword arguments."""


def journal(path: str | Path) -> JournalStorage:
    """The study storage in ``path``: safe for several processes on one file system."""
    return JournalStorage(JournalFileBackend(str(path)))


def make_pruner(settings: PrunerSettings) -> BasePruner:
    """The configured pruner; its steps are training timesteps."""
    return PRUNERS[settings.kind](**settings.model_dump(exclude={"kind"}))


def create_study(path: Path, config: TuneConfig) -> optuna.Study:
    """``config``'s new study in the journal ``path``, maximizing the inner score."""
    return optuna.create_study(
        storage=journal(path),
        study_name=config.name,
        # constant liar: with trials in parallel, running ones count as bad, so two workers
        # are not handed the same promising values
        sampler=TPESampler(**config.sampler.model_dump(), constant_liar=True),
        pruner=make_pruner(config.pruner),
        direction="maximize",
    )


def attach_trial(path: str, name: str, number: int, pruner: PrunerSettings) -> optuna.Trial:
    """Trial ``number`` of the study in ``path``, opened by whoever trains it: it only reports
    inner scores and asks the pruner (the driver drew its values)."""
    storage = journal(path)
    study = optuna.load_study(
        study_name=name, storage=storage, sampler=RandomSampler(), pruner=make_pruner(pruner)
    )
    study_id = storage.get_study_id_from_name(name)
    return optuna.Trial(study, storage.get_trial_id_from_study_id_trial_number(study_id, number))
