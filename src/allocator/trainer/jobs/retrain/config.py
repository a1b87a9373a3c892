"""The settings of one retraining job: what to train, on which spans, where to, how judged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from allocator.registry.naming import NAME_PATTERN
from allocator.trainer.jobs.retrain.gates import GateSettings
from allocator.trainer.training.config import (
    TRAINER_HELP,
    UNION_TAGS,
    TrainConfig,
    load_config,
    load_job_tree,
)
from allocator.typed_config import ConfigError, StrictModel, env_overrides, validate


class RetrainError(RuntimeError):
    """The retraining job could not run to a decision; the message says what to fix."""


class RetrainConfig(StrictModel):
    """One retraining job: what to train, on which spans, where it goes, how it is judged."""

    trainer: TrainConfig = Field(description=TRAINER_HELP)
    registry: Path = Field(description="model registry the server follows")
    model_name: str = Field("allocator", pattern=NAME_PATTERN, description="registry name")
    train_days: int = Field(1260, ge=2, description="trading days trained on")
    purge_days: int = Field(5, ge=0, description="trading days between training and held-out")
    holdout_days: int = Field(252, ge=3, description="most recent trading days, never trained on")
    cost_bps: float | None = Field(
        None, ge=0, description="held-out backtest costs (None: the trainer's env.cost_bps)"
    )
    gates: GateSettings = GateSettings()
    database_url: str | None = Field(
        None, description="trade database (None: DATABASE_URL, else sqlite:///allocator.db)"
    )
    pushgateway_url: str | None = Field(None, description="push job metrics here when set")
    job_name: str = Field("allocator_retrain", min_length=1, description="Pushgateway job")

    @field_validator("trainer", mode="before")
    @classmethod
    def _trainer_from_path(cls, value: Any) -> Any:
        if isinstance(value, str | Path):
            return load_config(value)
        return value

    @property
    def holdout_cost_bps(self) -> float:
        return self.trainer.env.cost_bps if self.cost_bps is None else self.cost_bps


def load_retrain_config(
    path: str | Path | None, overrides: list[str] | None = None
) -> RetrainConfig:
    """Read a retraining YAML (``trainer`` a path or a mapping) and apply ``--set`` overrides;
    ``ALLOCATOR_<KEY>`` environment variables (``ALLOCATOR_GATES__MAX_TURNOVER``) apply between
    the file and ``--set``, and an error they cause names them."""
    source = str(path) if path else "(defaults)"
    from_env = env_overrides(RetrainConfig)
    try:
        tree, trainer_file = load_job_tree(
            path, [o for _, o in from_env] + list(overrides or []), "retrain config"
        )
        if trainer_file:
            source = f"{source} (trainer: {trainer_file})"
        return validate(RetrainConfig, tree, source, tags=UNION_TAGS)
    except ConfigError as exc:
        if not from_env:
            raise
        shown = ", ".join(f"{name} ({o.partition('=')[0]})" for name, o in from_env)
        raise ConfigError(f"{exc}\n  set from the environment: {shown}") from exc
