"""Learning tests: TD3 on generated markets where the right answer is known, and the settings
every learning test starts from (``config``).

Slow (minutes): skipped by default, run by CI (``make test`` with CI=true passes --run-slow).
The adaptive regularizer's test on the rotating market lives beside the rotating fixture
(``test_shared_rotation.py``), whose MLP at seed 0 is the very run it judges.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from allocator.trainer.training.config import TrainConfig, load_config
from allocator.trainer.training.run import train
from tests.markets import drift_market, write_market

# About 3 minutes on one core here, and about as fast on CI: the limit leaves a wide margin
# and still stops a hang inside CI's 90 minutes.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
CI_MINUTES = 3  # on one idle core (tests/conftest.py orders slow modules by it)

PERIODS = [
    "data.train_start=2000-01-01",
    "data.train_end=2003-12-31",
    "data.validation_start=2004-01-01",
    "data.validation_end=2005-12-31",
]


def config(path: Path, steps: int, extra: list[str]) -> TrainConfig:
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


def test_td3_finds_the_drifting_asset(tmp_path):
    """One asset drifts up among drift-less ones: the trained agent holds > 80% of it."""
    path = write_market(drift_market(drift=0.004, vol=0.005), tmp_path / "drift.csv")
    run = train(config(path, 50_000, ["env.beta=0.2"]), tmp_path / "run")
    held = run.validation["td3"].executed_weights["UP"]
    assert held.mean() > 0.8, f"mean weight in the drifting asset on held-out days: {held.mean()}"
