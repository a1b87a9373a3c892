"""What a suite run is asked to do: the recipe, the markets, how many draws, which set, where."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveInt, field_validator

from allocator.trainer.jobs.executors import ExecutorKind, ExecutorSettings
from allocator.trainer.market.draws import DRAWS, SP500_DEV
from allocator.trainer.training.config import TRAINER_HELP, TrainConfig, load_job_config
from allocator.typed_config import StrictModel

Mode = Literal["development", "heldout"]


class RuleGrid(StrictModel):
    """The simple rules the suite chooses among on each draw's training span."""

    momentum_lookbacks: list[int] = Field([5, 10, 20, 40], description="top-k momentum lookbacks")
    reversal_lookbacks: list[int] = Field([1, 2, 5], description="top-k reversal lookbacks")
    ks: list[int] = Field([1, 2], min_length=1, description="how many assets a rule holds")


class SuiteConfig(ExecutorSettings):
    """A suite run: the recipe trained on every draw of every market, scored on held-out days."""

    name: str = Field("suite", pattern=r"^[A-Za-z0-9_.-]+$")
    trainer: TrainConfig = Field(TrainConfig(), description=TRAINER_HELP)
    trainer_source: str | None = Field(None, description="file the trainer config came from")
    mode: Mode = Field(
        "development",
        description="development: development draws (choosing allowed); heldout: held-out "
        "draws, to measure a fixed recipe (no choice may be made on its figures)",
    )
    markets: list[str] = Field(list(DRAWS), min_length=1, description="market kinds to run")
    draws: int = Field(5, ge=1, description="draws per generated market (the first of the set)")
    draws_per_market: dict[str, PositiveInt] = Field(
        {}, description="per market kind, its number of draws in place of draws"
    )
    sp500_years: list[int] = Field(
        list(DRAWS[SP500_DEV].development), description="test years of the S&P 500 market"
    )
    market_changes: dict[str, dict[str, Any]] = Field(
        {}, description="per market kind, trainer keys changed on top of the recipe"
    )
    rules: RuleGrid = RuleGrid()
    seed_per_draw: bool = Field(True, description="training seed = trainer.seed + draw")
    seeds: PositiveInt = Field(
        1,
        description="runs per draw, seeds MEMBER_SEED_STRIDE apart; above 1 the policy scored is "
        "their seed ensemble (the mean of their deterministic actions, as an export of those "
        "runs serves it)",
    )
    min_gap: float = Field(
        0.1, ge=0, description="ceiling - rule Sharpe below which a draw's gap closed is not read"
    )
    bootstrap_reps: int = Field(10_000, ge=100)
    executor: ExecutorKind = "processes"
    torch_threads: int = Field(1, ge=1, description="torch threads per run")
    output_dir: str = "runs/suite"

    @field_validator("markets", "market_changes", "draws_per_market")
    @classmethod
    def _known(cls, value: Any) -> Any:
        unknown = [m for m in value if m not in DRAWS]
        if unknown:
            raise ValueError(f"unknown market(s) {unknown}; known: {', '.join(DRAWS)}")
        return value


def load_suite_config(path: str | Path, overrides: Sequence[str] | None = None) -> SuiteConfig:
    """Read a suite YAML; ``trainer`` is a trainer YAML path (relative to the working
    directory, else to this file) or an inline mapping."""
    return load_job_config(SuiteConfig, path, overrides, "suite configuration")
