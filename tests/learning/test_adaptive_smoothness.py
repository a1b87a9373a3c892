"""The adaptive smoothness regularizer on the rotating market (the leading asset changes every
20 days, noise larger than the drift, 10 bps costs, no EMA): against none and a large fixed
lambda, each a flat MLP trained 40,000 steps at seed 0.

A module of its own, so that ``make test`` (``--dist loadfile``) hands it to one worker while
the other learning modules go to the other. Slow: skipped by default, run by CI with
--run-slow. The shared policy's comparison with the MLP on this market is a study
(``studies/rotation_representation.py``).
"""

from __future__ import annotations

import json

import pytest

from allocator.trainer.training.run import TrainingRun, train
from tests.learning.recipes import ROTATION, config
from tests.learning.yardsticks import regime_switch_lag
from tests.markets import rotating_market, rotating_schedule, write_market

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
CI_MINUTES = 6  # on one idle core: three 40,000-step MLP runs (tests/conftest.py orders)

STEPS = 40_000
UNREGULARIZED = [entry for entry in ROTATION if not entry.startswith("algorithm.smoothness")]


def test_adaptive_smoothness_is_decisive_but_calm(tmp_path):
    """Adaptive lambda beats a large fixed lambda on Sharpe and trades less than no
    regularizer: smooth, yet still decisive when the trend turns. On the known schedule, it
    follows a new leader in at most half the days the large lambda needs (the mean switching
    lag over the held-out regime changes)."""
    path = write_market(rotating_market(period=20), tmp_path / "rotating.csv")
    leader = rotating_schedule(period=20)

    def run(name: str, settings: list[str]) -> TrainingRun:
        return train(config(path, STEPS, [*settings, "seed=0"]), tmp_path / name)

    runs = {
        "adaptive": run("adaptive", list(ROTATION)),
        "none": run("none", [*UNREGULARIZED, "algorithm.smoothness.mode=none"]),
        "fixed_large": run(
            "fixed",
            [*UNREGULARIZED, "algorithm.smoothness.mode=fixed", "algorithm.smoothness.lam=20"],
        ),
    }
    assert runs["adaptive"].config.algorithm.smoothness.mode == "adaptive"
    table = {
        name: {
            k: run.validation["td3"].metrics()[k] for k in ("sharpe", "turnover", "total_return")
        }
        | {
            "final_lambda": run.summary["smooth_lambda"],
            "switch_lag": regime_switch_lag(run.validation["td3"].executed_weights, leader),
        }
        for name, run in runs.items()
    }
    print(json.dumps(table, indent=2))
    assert table["adaptive"]["sharpe"] > table["fixed_large"]["sharpe"], table
    assert table["adaptive"]["turnover"] < table["none"]["turnover"], table
    assert 2 * table["adaptive"]["switch_lag"] <= table["fixed_large"]["switch_lag"], table
