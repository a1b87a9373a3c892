"""Typed training configuration: YAML in, validated models out, errors naming the key; the
resolved config is written into every run directory so the run can be repeated exactly."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, model_validator

from allocator.trainer.agents.icm import ICMSettings
from allocator.trainer.agents.noise import NoiseSettings
from allocator.trainer.agents.regularizer import ActionBoundSettings, SmoothnessSettings
from allocator.trainer.sim.env import EnvConfig
from allocator.typed_config import (
    ConfigError,
    Model,
    StrictModel,
    apply_overrides,
    load_tree,
    read_yaml,
    validate,
)

UNION_TAGS = frozenset({"td3", "sac", "LinearSchedule"})
"""Tags pydantic puts in the error location of a trainer setting that no user typed: the
algorithm's discriminator value and the model member of ``float | LinearSchedule``."""


class LinearSchedule(StrictModel):
    """Learning rate going linearly from ``start`` to ``end`` over ``end_fraction`` of training."""

    start: float = Field(gt=0)
    end: float = Field(gt=0)
    end_fraction: float = Field(1.0, gt=0, le=1)


LearningRate = float | LinearSchedule


class DataSettings(StrictModel):
    """Which prices to learn from and which to validate on (never overlapping)."""

    dataset: str = Field(
        "sp500",
        description="'sp500', 'database' (the prices `allocator data ingest` stored in "
        "$DATABASE_URL) or a CSV/Parquet path",
    )
    as_of: dt.date | None = Field(
        None, description="ignore prices dated after this (None: all; 'database': up to today)"
    )
    assets: list[str] | None = Field(None, description="asset universe (default: all)")
    train_start: dt.date = dt.date(2000, 1, 1)
    train_end: dt.date = dt.date(2014, 12, 31)
    validation_start: dt.date = dt.date(2015, 1, 1)
    validation_end: dt.date = dt.date(2017, 12, 31)

    @model_validator(mode="after")
    def _ordered(self) -> DataSettings:
        if not (self.train_start < self.train_end < self.validation_start <= self.validation_end):
            raise ValueError(
                "need train_start < train_end < validation_start <= validation_end "
                f"(got {self.train_start}, {self.train_end}, {self.validation_start}, "
                f"{self.validation_end})"
            )
        if self.as_of is not None and self.as_of < self.validation_end:
            raise ValueError(
                f"as_of {self.as_of} is before validation_end {self.validation_end}: "
                "the validation span would lose its last prices"
            )
        return self


class _AlgoBase(StrictModel):
    gamma: float = Field(0.95, gt=0, le=1)
    batch_size: int = Field(256, ge=1)
    buffer_size: int = Field(200_000, ge=1)
    learning_starts: int = Field(1_000, ge=0)
    tau: float = Field(0.005, gt=0, le=1)
    train_freq: int = Field(1, ge=1)
    gradient_steps: int = Field(1, ge=-1)
    net_arch: list[int] = Field(default_factory=lambda: [256, 256])
    actor_learning_rate: LearningRate = 1e-4
    critic_learning_rate: LearningRate = 1e-3


class TD3Settings(_AlgoBase):
    """TD3 with Huber critics, clipping, policy delay, smoothness and the bound penalty."""

    name: Literal["td3"] = "td3"
    critic_loss: Literal["huber", "mse"] = "huber"
    huber_delta: float = Field(1.0, gt=0)
    max_grad_norm: float | None = Field(1.0, gt=0)
    policy_delay: int = Field(2, ge=1)
    target_policy_noise: float = Field(0.2, ge=0)
    target_noise_clip: float = Field(0.5, ge=0)
    smoothness: SmoothnessSettings = SmoothnessSettings()
    action_bound: ActionBoundSettings = ActionBoundSettings()


class SACSettings(_AlgoBase):
    """SAC with its own actor and critic learning rates."""

    name: Literal["sac"] = "sac"
    actor_learning_rate: LearningRate = 3e-4
    critic_learning_rate: LearningRate = 3e-4
    ent_coef: str | float = "auto"


AlgoSettings = Annotated[TD3Settings | SACSettings, Field(discriminator="name")]


class SharedPolicySettings(StrictModel):
    """Size of the per-asset shared networks (``policy: shared``); ``net_arch`` is the MLP's."""

    hidden: int = Field(64, ge=1, description="width of the per-asset encoder and heads")
    center_assets: bool = Field(
        True,
        description="subtract the live assets' mean score before the tanh, so no common shift "
        "can saturate every asset action at once (off: the uncentred actor, which can freeze "
        "with every asset action at +1)",
    )


SelectionMetric = Literal["sharpe", "sortino", "calmar", "annual_return", "total_return"]
"""Backtest figures a checkpoint may be chosen by: all of them higher-is-better."""


class SelectionSettings(StrictModel):
    """Keep the checkpoint scoring best on an inner span cut from training (``selection.py``)."""

    enabled: bool = Field(False, description="choose the best checkpoint on the inner span")
    inner_fraction: float = Field(
        0.2, gt=0, lt=1, description="share of the training span's trading days held out"
    )
    inner_days: int | None = Field(
        None, ge=5, description="trading days held out; replaces inner_fraction when set"
    )
    purge_days: int = Field(
        5, ge=0, description="trading days between training and inner span, used by neither"
    )
    eval_every: int = Field(2_000, ge=1, description="steps between two inner backtests")
    patience: int = Field(
        5, ge=0, description="stop after this many evaluations without improvement (0: never)"
    )
    metric: SelectionMetric = Field("sharpe", description="inner backtest figure to maximize")
    fallback_level: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="keep the zero action (under the tilt mapping, the anchor) unless the kept "
        "checkpoint beats it on the inner span: its excess Sharpe's interval at this level lies "
        "above 0 (None: keep the checkpoint)",
    )


class SaturationWatchSettings(StrictModel):
    """How often the saturation watch measures the actor (``training/saturation.py``)."""

    every: int = Field(
        1_000,
        ge=0,
        description="steps between two checks of the actor's saturation on the probe set "
        "(0: only at selection evaluations and at the end)",
    )


class TrackingSettings(StrictModel):
    """Where a run is also logged for side-by-side comparison (``training/tracking.py``)."""

    backend: Literal["none", "mlflow"] = Field(
        "none", description="'mlflow': log the run to MLflow (the `mlflow` extra); 'none': do not"
    )
    uri: str | None = Field(
        None,
        description="MLflow tracking URI (None: $MLFLOW_TRACKING_URI, else MLflow's own default)",
    )
    experiment: str = Field(
        "allocator", min_length=1, description="MLflow experiment the run goes to (made if new)"
    )
    registered_model: str | None = Field(
        None,
        min_length=1,
        description="MLflow registered model that an export adds a version to "
        "(None: the registry model's name)",
    )
    parent_run_id: str | None = Field(
        None,
        min_length=1,
        description="MLflow run this run nests under (walk-forward and tuning set it for each "
        "window and trial)",
    )

    @property
    def enabled(self) -> bool:
        return self.backend == "mlflow"


class TrainConfig(StrictModel):
    """Everything one training run needs."""

    name: str = Field("run", pattern=r"^[A-Za-z0-9_.-]+$", description="run name prefix")
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # On an idle 2-core machine torch's default (2 threads) is ~1.4x faster than 1; when other
    # processes share the cores (parallel tests, several runs) 1 thread avoids a 5-25x collapse.
    torch_threads: int = Field(0, ge=0, description="torch CPU threads (0 = torch default)")
    total_timesteps: int = Field(20_000, ge=1)
    output_dir: str = "runs"
    progress_bar: bool = True
    tensorboard: bool = Field(
        False,
        description="SB3's TensorBoard event files beside progress.csv (the tensorboard extra); "
        "off by default so the train extra alone runs every config",
    )
    html_report: bool = Field(
        True,
        description="write report.html (plotly, self-contained: about 5 MB) beside the "
        "validation PNGs; the walk-forward, tuning and suite jobs turn it off for their runs "
        "and write their own report",
    )
    validation_episodes: int = Field(1, ge=1)
    policy: Literal["mlp", "shared"] = Field(
        "mlp", description="'mlp': one flat network; 'shared': one network applied per asset"
    )
    shared: SharedPolicySettings = SharedPolicySettings()
    data: DataSettings = DataSettings()
    env: EnvConfig = EnvConfig()
    algorithm: AlgoSettings = TD3Settings()
    noise: NoiseSettings = NoiseSettings()
    icm: ICMSettings = ICMSettings()
    selection: SelectionSettings = SelectionSettings()
    checkpoint_every: int = Field(
        0, ge=0, description="steps between resumable checkpoints (0: none)"
    )
    saturation_watch: SaturationWatchSettings = SaturationWatchSettings()
    tracking: TrackingSettings = TrackingSettings()

    @model_validator(mode="before")
    @classmethod
    def _default_algorithm(cls, data: Any) -> Any:
        """An ``algorithm`` section without ``name`` means TD3, the default algorithm."""
        if isinstance(data, dict) and isinstance(data.get("algorithm"), dict):
            data = {**data, "algorithm": {"name": "td3", **data["algorithm"]}}
        return data

    @model_validator(mode="after")
    def _no_flat_tilt(self) -> TrainConfig:
        """Refuse the flat MLP under the tilt mapping: nothing pins the shift common to every
        action, which the tilt ignores, and no graph serves the combination."""
        if self.policy == "mlp" and self.env.action.mapping == "tilt":
            raise ValueError(
                "policy: mlp with env.action.mapping: tilt is refused: the tilt ignores a shift "
                "common to every action, which the flat MLP can drift along until every action "
                "sits at +1 (a frozen book). Use policy: shared with the tilt, or the affine "
                "mapping with the MLP"
            )
        return self


TRAINER_HELP = (
    "trainer config: a YAML path or inline settings; a job file's trainer_changes (a mapping) "
    "is merged into it, key by key, before --set"
)


def load_job_tree(
    path: str | Path | None, overrides: Sequence[str] | None, what: str
) -> tuple[dict[str, Any], str | None]:
    """The settings tree of a job config embedding a trainer config, and the trainer file it
    inlined: ``--set trainer=`` first, the file inlined (so ``--set trainer.x`` works either
    way), then ``trainer_changes`` key by key, then the other ``--set``."""
    tree, source = load_tree(path, None, what)
    overrides = list(overrides or [])
    swaps = [o for o in overrides if o.partition("=")[0].strip() == "trainer"]
    tree = apply_overrides(tree, swaps, source)
    trainer = tree.get("trainer")
    found: Path | None = None
    if isinstance(trainer, str):
        here = [Path(trainer)] + ([Path(path).parent / trainer] if path is not None else [])
        found = next((c for c in here if c.is_file()), None)
        if found is None:
            raise ConfigError(f"{source}: trainer config {trainer!r} not found")
        tree["trainer"] = read_yaml(found, "trainer config")
    changes = tree.pop("trainer_changes", None)
    if changes is not None:
        if not isinstance(changes, dict):
            raise ConfigError(f"{source}: trainer_changes must be a mapping of trainer keys")
        tree["trainer"] = merged(tree.get("trainer") or {}, changes)
    tree = apply_overrides(tree, [o for o in overrides if o not in swaps], source)
    return tree, None if found is None else str(found)


def load_job_config(
    model: type[Model],
    path: str | Path,
    overrides: Sequence[str] | None,
    what: str,
    tags: frozenset[str] = UNION_TAGS,
) -> Model:
    """A job config read by ``load_job_tree``, its ``trainer_source`` the trainer file inlined."""
    tree, trainer_file = load_job_tree(path, overrides, "config file")
    if trainer_file is not None:
        tree["trainer_source"] = trainer_file
    return validate(model, tree, str(path), what, tags=tags)


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` merged in: mappings key by key, any other value replaced."""
    out = dict(base)
    for key, value in changes.items():
        old = out.get(key)
        out[key] = (
            merged(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
        )
    return out


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML config (or defaults when ``path`` is None) and apply ``--set`` overrides."""
    tree, source = load_tree(path, overrides)
    return validate(TrainConfig, tree, source, tags=UNION_TAGS)


def dump_config(config: TrainConfig) -> str:
    """YAML of the fully resolved config (every default spelled out)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
