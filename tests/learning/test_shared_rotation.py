"""Learning tests on the rotating market (the leading asset changes every 20 days, noise larger
than the drift, 10 bps costs): the shared policy against the flat MLP and the best top-k
momentum rule chosen on the training span, and the adaptive smoothness regularizer against
none and a large fixed lambda.

One module-scoped fixture trains both policies at three seeds (about 14 minutes on one core)
and the tests judge the runs; the regularizer's test trains two more MLPs and reuses the
fixture's MLP at seed 0, which is its adaptive run to the bit (the same settings, seed and
market). A module of its own, so that ``make test`` (``--dist loadfile``) hands it to one
worker while the other learning modules go to the other. Slow: skipped by default, run by CI
with --run-slow.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from allocator.trainer.market.data import load_dataset
from allocator.trainer.training.run import TrainingRun, train
from tests.learning.recipes import ROTATION, SHARED_ROTATION, config, figures, metrics, train_both
from tests.learning.yardsticks import held_out_ensemble, held_out_momentum, regime_switch_lag
from tests.markets import rotating_market, rotating_schedule, write_market

# The fixture takes about 14 minutes on one idle core (38 beside other jobs): the limit
# leaves room for that and still stops a hang inside CI's 90 minutes.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
CI_MINUTES = 18  # on one idle core: the fixture's six runs and the two here


ROTATING_SEEDS = (0, 1, 2)
"""One seed is not a judge here: in one measurement at seed 0 the two policies tied (held-out
Sharpe 6.15 shared, 6.19 MLP) while at seeds 1 and 2 the MLP reached 5.33 and 0.58 and the
shared policy 6.37 and 6.57. A change that only moves rounding (the pooled sums' order) moved
seed 0's shared figure from 6.44 to 6.15, so the tests below judge the median over seeds."""


@pytest.fixture(scope="module")
def rotating(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[TrainingRun]]]:
    """The rotating market with 10 bps costs, the MLP after 40,000 steps and the shared
    policy after 20,000 (both with the adaptive regularizer), at each of ``ROTATING_SEEDS``:
    trained once, judged by every test below."""
    tmp_path = tmp_path_factory.mktemp("rotating")
    path = write_market(rotating_market(period=20), tmp_path / "rotating.csv")
    runs: dict[str, list[TrainingRun]] = {"mlp": [], "shared": []}
    for seed in ROTATING_SEEDS:
        pair = train_both(
            tmp_path / f"seed{seed}",
            path,
            {"mlp": 40_000, "shared": 20_000},
            [*ROTATION, f"seed={seed}"],
            shared_extra=SHARED_ROTATION,
        )
        for name, run in pair.items():
            runs[name].append(run)
    return path, runs


def _median_sharpe(runs: list[TrainingRun]) -> float:
    return float(np.median([figures(run)["sharpe"] for run in runs]))


def test_shared_tilt_beats_the_mlp_on_the_rotating_market_at_half_the_steps(rotating):
    """Over three seeds, the shared policy after 20,000 steps has a higher median held-out
    Sharpe than the MLP after 40,000."""
    _, runs = rotating
    table = {name: [figures(run) for run in seeds] for name, seeds in runs.items()}
    print(json.dumps(table, indent=2))
    assert _median_sharpe(runs["shared"]) > _median_sharpe(runs["mlp"]), table


@pytest.mark.xfail(
    strict=False,
    reason="known shortfall: on this draw the best top-k momentum rule chosen on the training "
    "span scores 6.61; the seeds' ensemble 6.53 (centred + relative), their median "
    "6.22; here even the Bayes filter of the market's own model scores below the rule (6.45, "
    "studies/rotation_ceiling.py). Over 32 fresh draws one seed of the recipe is at -0.15 [-0.36, "
    "+0.06] against the rule (studies/rotation_many_draws.py): it matches the rule. Three seeds' "
    "ensemble, chosen on draws 1-4, beats it on draws 42-57, +0.32 [+0.12, +0.49] "
    "(studies/rotation_ensemble.py, RESULTS.md), and on the first fresh draw where the "
    "filter clears the rule (test_ensemble_beats_momentum.py): one draw where the filter does "
    "not cannot show it",
)
def test_shared_tilt_beats_the_best_momentum_rule_chosen_on_the_training_span(rotating):
    """Net of the same costs on the same held-out days, the ensemble of the three seeds (their
    actions averaged, as a served seed ensemble acts) beats the best top-k momentum rule (k 1
    or 2, lookback 5 to 40 days) whose k and lookback were chosen on the training span, never
    on the held-out days: the bar a rotation-follower must clear. The ensemble is judged, not
    the seeds' median, because it was the higher of the two on the development draws 1-4
    (``studies/rotation_dev_sweep.py --seeds 0 1 2``, the rule fixed before that run)."""
    path, runs = rotating
    shared = runs["shared"]
    data = load_dataset(str(path))
    table: dict = {"shared": [figures(run) for run in shared]}
    table["ensemble"] = metrics(held_out_ensemble(shared, data))
    choice, momentum = held_out_momentum(shared[0], data)
    table["momentum"] = metrics(momentum) | {
        "rule": repr(choice.rule),
        "training_span_sharpe": choice.sharpe,
        "training_span_candidates": choice.scores,
    }
    print(json.dumps(table, indent=2))
    assert table["ensemble"]["sharpe"] > table["momentum"]["sharpe"], table


def test_adaptive_smoothness_is_decisive_but_calm(rotating, tmp_path):
    """A rotating trend with 10 bps costs: adaptive lambda beats a large fixed lambda on Sharpe
    and trades less than no regularizer: smooth, yet still decisive when the trend turns. On
    the known schedule, it follows a new leader in at most half the days the large lambda
    needs (the mean switching lag over the held-out regime changes). The adaptive run is the
    fixture's MLP at seed 0 (``ROTATION``: adaptive, lambda 1, budget 0.05, 40,000 steps)."""
    path, fixture = rotating
    adaptive = fixture["mlp"][ROTATING_SEEDS.index(0)]
    assert adaptive.config.algorithm.smoothness.mode == "adaptive"  # the run judged below
    leader = rotating_schedule(period=20)

    def other(name: str, smooth: list[str]) -> TrainingRun:
        overrides = ["env.beta=0.0", "env.cost_bps=10", *smooth]  # ROTATION's; seed 0, the default
        return train(config(path, adaptive.config.total_timesteps, overrides), tmp_path / name)

    runs = {
        "none": other("none", ["algorithm.smoothness.mode=none"]),
        "fixed_large": other(
            "fixed", ["algorithm.smoothness.mode=fixed", "algorithm.smoothness.lam=20"]
        ),
        "adaptive": adaptive,
    }
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
