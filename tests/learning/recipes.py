"""The learning tests' settings and training helpers, shared by the tests and by the studies in
``studies/`` (which must train exactly what the tests train).

``config`` is every learning test's starting point (a small TD3 on a generated market's
training and held-out spans); ``SHARED`` turns it into the shared policy tilting an
equal-weight anchor; ``ROTATION`` and ``SHARED_ROTATION`` are the rotating market's settings.
"""

from __future__ import annotations

from pathlib import Path

from allocator.trainer.sim.backtest import BacktestResult
from allocator.trainer.training.config import TrainConfig, load_config
from allocator.trainer.training.run import TrainingRun, train

PERIODS = [
    "data.train_start=2000-01-01",
    "data.train_end=2003-12-31",
    "data.validation_start=2004-01-01",
    "data.validation_end=2005-12-31",
]


def config(path: Path, steps: int, extra: list[str]) -> TrainConfig:
    """The learning tests' TD3 on the market at ``path`` for ``steps`` steps, then ``extra``."""
    return load_config(
        None,
        [
            "name=learning",
            f"total_timesteps={steps}",
            "progress_bar=false",
            "torch_threads=1",  # tests run in parallel workers
            "tensorboard=false",
            f"data.dataset={path}",
            *PERIODS,
            "env.max_assets=4",
            "env.min_assets=4",
            "env.window=20",
            "env.episode_length=100",
            "env.reward.transaction_cost.long_weight=0",
            "env.reward.scale=100",
            "algorithm.net_arch=[64,64]",
            "algorithm.batch_size=64",
            "algorithm.learning_starts=500",
            "algorithm.gamma=0.5",
            "algorithm.actor_learning_rate=0.001",
            "noise.sigma=0.5",
            "noise.final_sigma=0.1",
            *extra,
        ],
    )


SHARED = [
    "policy=shared",
    "env.features=asset_v1",
    "env.action.mapping=tilt",
    # k = 3 lets one decision put ~97% into one of 4-12 assets: the tests' targets need it.
    "env.action.k=3",
    "env.action.anchor.kind=equal",
]
"""The shared policy: per-asset features, tilting an equal-weight anchor."""

ROTATION = (
    "env.beta=0.0",
    "env.cost_bps=10",
    "algorithm.smoothness.mode=adaptive",
    "algorithm.smoothness.lam=1",
    "algorithm.smoothness.budget=0.05",
)
"""Both policies' settings on the rotating market: 10 bps, no EMA, the adaptive regularizer."""

SHARED_ROTATION = ("shared.center_assets=true", "env.reward.relative_to=anchor")
"""The shared policy's recipe on the rotating market, chosen on other draws of its generator
(``studies/rotation_dev_sweep.py``: draws 1-4, eight candidates, the highest mean held-out
Sharpe over the momentum rule), never on a test's draw: centred asset scores, so no seed
freezes with every asset action at +1, and the reward measured against the anchor."""


def train_both(
    tmp_path: Path,
    path: Path,
    steps: dict[str, int],
    extra: list[str],
    shared_extra: tuple[str, ...] = (),
) -> dict[str, TrainingRun]:
    """The flat MLP and the shared policy on the same market and settings (``steps`` per name)."""
    runs = {}
    for name, more in (("mlp", []), ("shared", [*SHARED, *shared_extra])):
        runs[name] = train(config(path, steps[name], [*extra, *more]), tmp_path / name)
    return runs


def train_shared(
    tmp_path: Path, path: Path, steps: int, extra: list[str], shared_extra: tuple[str, ...] = ()
) -> TrainingRun:
    """The shared policy alone."""
    return train(config(path, steps, [*extra, *SHARED, *shared_extra]), tmp_path / "shared")


def metrics(result: BacktestResult) -> dict[str, float]:
    """Sharpe, turnover and total return of a backtest."""
    return {k: result.metrics()[k] for k in ("sharpe", "turnover", "total_return")}


def figures(run: TrainingRun, asset: str | None = None) -> dict[str, float]:
    """A run's held-out ``metrics`` (and its mean weight in ``asset``), steps and policy."""
    result = run.validation["td3"]
    out = metrics(result)
    if asset is not None:
        out[f"mean_weight_{asset}"] = float(result.executed_weights[asset].mean())
    return out | {"steps": run.config.total_timesteps, "policy": run.config.policy}
