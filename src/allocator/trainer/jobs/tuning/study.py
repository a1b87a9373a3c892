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

from allocator.trainer.jobs.tuning.config import (
    HalvingPrunerSettings,
    MedianPrunerSettings,
    PrunerSettings,
    SamplerSettings,
    ThresholdPrunerSettings,
)

STORAGE_FILE = "study.journal"


def journal(path: str | Path) -> JournalStorage:
    """The study storage in ``path``: safe for several processes on one file system."""
    return JournalStorage(JournalFileBackend(str(path)))


def make_pruner(settings: PrunerSettings) -> BasePruner:
    """The configured pruner; its steps are training timesteps."""
    if isinstance(settings, MedianPrunerSettings):
        return MedianPruner(
            n_startup_trials=settings.n_startup_trials,
            n_warmup_steps=settings.n_warmup_steps,
            interval_steps=settings.interval_steps,
        )
    if isinstance(settings, HalvingPrunerSettings):
        return SuccessiveHalvingPruner(
            min_resource=settings.min_resource,
            reduction_factor=settings.reduction_factor,
            min_early_stopping_rate=settings.min_early_stopping_rate,
        )
    if isinstance(settings, ThresholdPrunerSettings):
        return ThresholdPruner(
            lower=settings.lower, upper=settings.upper, n_warmup_steps=settings.n_warmup_steps
        )
    return NopPruner()


def make_sampler(settings: SamplerSettings) -> TPESampler:
    """Seeded TPE; with trials in parallel it assumes running trials score badly (constant
    liar), so two workers do not get the same promising values."""
    return TPESampler(
        seed=settings.seed, n_startup_trials=settings.n_startup_trials, constant_liar=True
    )


def create_study(
    path: Path, name: str, sampler: SamplerSettings, pruner: PrunerSettings
) -> optuna.Study:
    """A new study in the journal ``path``, maximizing the inner score."""
    return optuna.create_study(
        storage=journal(path),
        study_name=name,
        sampler=make_sampler(sampler),
        pruner=make_pruner(pruner),
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
