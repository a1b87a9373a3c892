"""The settings of one retraining job: what to train, on which spans, where to, how judged; and
the spans themselves, in trading days back from ``as_of``: train, a purge gap, then the held-out
span (the most recent data, never trained on)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import Field, field_validator

from allocator.registry.naming import NAME_PATTERN
from allocator.trainer.jobs.retrain.gates import GateSettings
from allocator.trainer.market.data import DataError, DateLike
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


@dataclass(frozen=True)
class RetrainSpans:
    """Inclusive trading-date spans: train, then a purge gap, then the held-out span."""

    train_start: dt.date
    train_end: dt.date
    holdout_start: dt.date
    holdout_end: dt.date


def retrain_spans(
    dates: pd.DatetimeIndex,
    as_of: DateLike | None,
    *,
    train_days: int,
    purge_days: int,
    holdout_days: int,
    source: str = "data",
) -> RetrainSpans:
    """The spans ending on the last trading date on or before ``as_of`` (None: the last date)."""
    if as_of is None:
        end = len(dates) - 1
    else:
        try:
            stamp = pd.Timestamp(as_of)
        except ValueError as exc:
            raise DataError(f"as-of date {as_of!r} is not a date: {exc}") from exc
        end = int(dates.searchsorted(stamp, "right")) - 1
    if end < 0:
        raise DataError(
            f"{source}: no trading date on or before {as_of} (data starts {dates[0].date()})"
        )
    holdout_start = end - holdout_days + 1
    train_end = holdout_start - purge_days - 1
    train_start = train_end - train_days + 1
    if train_start < 0:
        need = train_days + purge_days + holdout_days
        raise DataError(
            f"{source}: {end + 1} trading dates up to {dates[end].date()}, but retraining needs "
            f"train_days + purge_days + holdout_days = {need}"
        )
    return RetrainSpans(
        dates[train_start].date(),
        dates[train_end].date(),
        dates[holdout_start].date(),
        dates[end].date(),
    )
