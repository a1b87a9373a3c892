"""What a tuning study is asked to do: the base trainer, the search space, the budget, where."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from allocator.trainer.jobs.tuning.space import ParamSpec, SearchSpace, check_space
from allocator.trainer.market.draws import require_development_dataset
from allocator.trainer.training.config import TRAINER_HELP, UNION_TAGS, TrainConfig, load_job_config
from allocator.typed_config import StrictModel

TAGS = UNION_TAGS | {"median", "halving", "threshold"}
"""Union tags pydantic puts in an error location that no user typed (see ``key_path``)."""


class TuneError(RuntimeError):
    """A study that cannot start or finish; the message says what to do."""


class SamplerSettings(StrictModel):
    """Optuna's TPE sampler: random for ``n_startup_trials``, then guided by the results."""

    seed: int = Field(0, description="seed of every draw: a local study is repeatable")
    n_startup_trials: int = Field(5, ge=1, description="random trials before TPE takes over")


class MedianPrunerSettings(StrictModel):
    """Stop a trial whose inner score is below the median of earlier trials at that step."""

    kind: Literal["median"] = "median"
    n_startup_trials: int = Field(4, ge=0, description="trials that are never pruned")
    n_warmup_steps: int = Field(0, ge=0, description="training steps before pruning may start")
    interval_steps: int = Field(1, ge=1, description="steps between two pruning checks")


class HalvingPrunerSettings(StrictModel):
    """Asynchronous successive halving: keep the top 1/``reduction_factor`` at each rung."""

    kind: Literal["halving"] = "halving"
    min_resource: int | Literal["auto"] = Field(
        "auto", description="training steps before the first rung ('auto': from trial 0)"
    )
    reduction_factor: int = Field(4, ge=2)
    min_early_stopping_rate: int = Field(0, ge=0)


class ThresholdPrunerSettings(StrictModel):
    """Stop a trial whose inner score leaves ``[lower, upper]``: a floor no setting should miss."""

    kind: Literal["threshold"] = "threshold"
    lower: float | None = None
    upper: float | None = None
    n_warmup_steps: int = Field(0, ge=0, description="training steps before pruning may start")


class NoPruning(StrictModel):
    """Every trial trains to its end (or to selection's own early stop)."""

    kind: Literal["none"] = "none"


PrunerSettings = Annotated[
    MedianPrunerSettings | HalvingPrunerSettings | ThresholdPrunerSettings | NoPruning,
    Field(discriminator="kind"),
]


class TuneConfig(StrictModel):
    """A study: the base trainer config, the keys to search, the trial budget, the executor."""

    name: str = Field("tune", pattern=r"^[A-Za-z0-9_.-]+$", description="study name")
    trainer: TrainConfig = Field(TrainConfig(), description=TRAINER_HELP)
    trainer_source: str | None = Field(None, description="file the trainer config came from")
    space: dict[str, ParamSpec] = Field(
        min_length=1, description="dotted trainer key -> range {low, high, log, step} or choices"
    )
    n_trials: int = Field(20, ge=1, description="trials to run (pruned and failed ones count)")
    timeout_s: float | None = Field(
        None, gt=0, description="start no trial after this many seconds (None: no limit)"
    )
    enqueue_base: bool = Field(
        True, description="trial 0 trains the base config's own values of the space's keys"
    )
    sampler: SamplerSettings = SamplerSettings()
    pruner: PrunerSettings = MedianPrunerSettings()
    stop_after_failures: int = Field(
        3, ge=1, description="start no trial after this many failed trials in a row"
    )
    output_dir: str = "runs/tune"
    executor: Literal["local", "ray"] = "local"
    ray_address: str | None = Field(None, description="None: start a local Ray")
    parallel: int | None = Field(
        None, ge=1, description="trials at once on Ray (None: one per CPU Ray sees)"
    )
    torch_threads: int | None = Field(
        None, ge=1, description="torch threads per trial (None: 1 on Ray, else the trainer's)"
    )

    def search_space(self, source: str = "(tuning config)") -> SearchSpace:
        """The space checked against the base trainer config (``ConfigError`` naming keys)."""
        return check_space(self.space, self.trainer, source, enqueue_base=self.enqueue_base)


def load_tune_config(path: str | Path, overrides: Sequence[str] | None = None) -> TuneConfig:
    """Read a tuning YAML and check its search space against its trainer config."""
    config = load_job_config(TuneConfig, path, overrides, "tuning configuration", TAGS)
    config.search_space(str(path))
    # A study chooses: a suite market's held-out draw may not be its data.
    require_development_dataset(config.trainer.data.dataset, "allocator tune")
    return config
