"""What a walk-forward run is asked to do: the trainer, the windows, evaluation and recording."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from allocator.trainer.jobs.evaluation import DEFAULT_BASELINES, BaselineFit
from allocator.trainer.jobs.executors import ExecutorSettings
from allocator.trainer.market.windows import WindowSpec
from allocator.trainer.sim.baselines import ANCHOR, BaselineName
from allocator.trainer.training.config import TRAINER_HELP, TrainConfig, load_job_config
from allocator.typed_config import StrictModel, flatten

EQUAL_WEIGHT = BaselineName.EQUAL_WEIGHT.value
"""The reference baseline: excess Sharpe and the regime of a window are measured against it."""

REGIMES = ("bull", "bear", "sideways")
RESUME_FREE = frozenset(
    {
        "executor",
        "ray_address",
        "workers",
        "retries",
        "retry_exceptions",
        "progress_every",
        "trainer_source",
        "trainer.tracking",
    }
)
"""Config keys a resume may change: where and how the windows run, never what they compute."""


class WalkForwardError(RuntimeError):
    """A walk-forward run that cannot start or finish; the message says what to do."""


class RegimeThresholds(StrictModel):
    """Market regime of a test window by equal weight's annualized net return over it."""

    bull_above: float = Field(
        0.10, allow_inf_nan=False, description="bull when the return is >= this"
    )
    bear_below: float = Field(0.0, description="bear when the return is < this")

    def classify(self, annual_return: float) -> str:
        if annual_return >= self.bull_above:
            return "bull"
        if annual_return < self.bear_below:
            return "bear"
        return "sideways"


class Goals(StrictModel):
    """The fractions of windows we hold the agent to (reported as met or not)."""

    positive_sharpe: float = Field(0.70, ge=0, le=1)
    beats_equal_weight: float = Field(0.60, ge=0, le=1)


class StatisticsSettings(StrictModel):
    """How the report's intervals and tests are drawn (seeded: reproducible from returns.csv)."""

    level: float = Field(0.95, gt=0, lt=1, description="confidence level of the intervals")
    reps: int = Field(1000, ge=100, description="bootstrap replications per interval and test")
    seed: int = Field(0, ge=0, description="seed of every bootstrap")
    block_size: int | None = Field(
        None, ge=1, description="mean bootstrap block in days (None: Politis-White estimate)"
    )
    interval: Literal["percentile", "bca"] = "percentile"
    trials_sharpe_variance: float | None = Field(
        None,
        ge=0,
        description="annualized variance of the Sharpe ratios of the configurations tried "
        "(None: a zero-Sharpe series' sampling variance over the same days)",
    )


class WalkForwardConfig(ExecutorSettings):
    """A walk-forward run: the trainer config, the windows, and how to evaluate and record."""

    name: str = Field("walk_forward", pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int | None = Field(None, description="window k trains with seed + k (None: trainer's)")
    trainer: TrainConfig = Field(TrainConfig(), description=TRAINER_HELP)
    trainer_source: str | None = Field(None, description="file the trainer config came from")
    windows: WindowSpec
    cost_bps: float = Field(10.0, ge=0, lt=5_000, description="costs of every test backtest")
    baselines: list[str] = Field(default_factory=lambda: list(DEFAULT_BASELINES))
    baseline_fit: BaselineFit = "train"
    baseline_rebalance_every: int = Field(21, ge=1, description="days between refits/rebalances")
    regimes: RegimeThresholds = RegimeThresholds()
    goals: Goals = Goals()
    registry: str = "models"
    model_name: str = Field("allocator-wf", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
    output_dir: str = "runs/walk_forward"
    record: bool = True
    database_url: str | None = Field(
        None, description="None: $ALLOCATOR_DATABASE_URL, else $DATABASE_URL, else SQLite"
    )
    pushgateway_url: str | None = None
    job_name: str = Field("allocator_walk_forward", min_length=1)
    torch_threads: int = Field(1, ge=1, description="torch threads per window, every executor")
    retry_exceptions: bool = Field(
        False,
        description="processes and Ray: also rerun (up to retries times) a window that raised",
    )
    progress_every: int = Field(
        1000, ge=1, description="training steps between writes of a window's progress file"
    )
    configurations_tried: int = Field(
        1,
        ge=1,
        description="recipes/configs tried on these windows, this one included (1: no "
        "selection); the deflated Sharpe discounts the best-of-N luck",
    )
    statistics: StatisticsSettings = StatisticsSettings()

    @field_validator("baselines")
    @classmethod
    def _known(cls, names: list[str]) -> list[str]:
        valid = {b.value for b in BaselineName}
        bad = [n for n in names if n not in valid]
        if bad:
            raise ValueError(f"unknown baseline(s) {bad}; choose from {sorted(valid)}")
        if EQUAL_WEIGHT not in names:
            raise ValueError("equal-weight is required: excess Sharpe and regimes use it")
        return list(dict.fromkeys(names))

    @model_validator(mode="after")
    def _anchor_needs_tilt(self) -> WalkForwardConfig:
        if ANCHOR in self.baselines and self.trainer.env.action.tilt_anchor is None:
            rest = ",".join(b for b in self.baselines if b != ANCHOR)
            raise ValueError(
                "baseline 'anchor' holds the trainer's tilt anchor, but trainer.env.action."
                f"mapping is {self.trainer.env.action.mapping!r}: drop it (--set "
                f"'baselines=[{rest}]') or use mapping: tilt"
            )
        return self


def load_walk_forward_config(
    path: str | Path, overrides: Sequence[str] | None = None
) -> WalkForwardConfig:
    """Read a walk-forward YAML; ``trainer`` is a trainer YAML path or an inline mapping,
    inlined before ``--set`` overrides apply (``--set trainer=other.yaml`` swaps it)."""
    return load_job_config(WalkForwardConfig, path, overrides, "walk-forward configuration")


def config_differences(
    run: dict[str, Any], now: dict[str, Any], free: frozenset[str] = RESUME_FREE
) -> list[tuple[str, Any, Any]]:
    """The dotted keys whose values differ, in order, outside ``free``: (key, run's, now)."""
    a, b = flatten(run), flatten(now)
    missing = object()
    return [
        (k, a.get(k, missing), b.get(k, missing))
        for k in sorted(set(a) | set(b))
        if not any(k == f or k.startswith(f"{f}.") for f in free)
        and a.get(k, missing) != b.get(k, missing)
    ]
