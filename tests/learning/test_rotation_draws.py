"""The shared policy against the momentum bar on fresh draws of the rotating market.

One draw cannot judge this comparison: on the held-out days of ``rotating_market(seed=0)`` the
Bayes filter of the market's own model (``yardsticks.RotationFilter``, which knows the drift,
the noise and the redraw rate) scores below the momentum rule chosen on the training span
(6.45 and 6.50 against 6.61, ``rotation_ceiling.py``): on that draw the bar sits above
what knowing the market's model earns. This module judges the same comparison over five draws
of the generator that no run had touched when the rule below was written (2026-11-27, before
any of them was generated): draws 5-9, the fixture's recipe and budget, training seed = draw
(the development sweep's convention). The claim: averaged over the draws, the policy's held-out
Sharpe net of 10 bps beats that draw's best top-k momentum rule chosen on its training span.

It passed (+0.13, ahead on 2 of 5), but five draws are too few: over 32 later fresh draws
(10-41, ``rotation_many_draws.py``) the same recipe is at -0.15 [-0.36, +0.06] against the
rule, ahead on 15 (RESULTS.md). So this test is a floor on these five draws, which a
regression would fall through, not evidence that the policy beats the rule. The evidence that
a policy beats it is the three-seed ensemble's, over draws 42-57 (``rotation_ensemble.py``):
+0.32 [+0.12, +0.49], 48 trainings, more than CI can run.

About 16 minutes on one core alone (five 20,000-step runs; 29 beside other training): a module
of its own, so that ``--dist loadfile`` hands it to one worker. Slow: skipped by default, run
by CI with --run-slow.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from allocator.trainer.market.data import load_dataset
from allocator.trainer.training.run import train
from tests.learning.test_learning import config
from tests.learning.test_shared_policy import SHARED
from tests.learning.test_shared_rotation import ROTATION, SHARED_ROTATION
from tests.learning.yardsticks import RotationFilter, held_out_rule, momentum_for
from tests.markets import rotating_market, write_market

# About 16 minutes on one idle core (29 beside other training on 2026-11-27); the limit leaves
# a margin and still stops a hang inside CI's 90 minutes.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

FRESH_DRAWS = (5, 6, 7, 8, 9)
"""Test draws: never used to choose anything (the development sweep refuses them)."""


def judge_draw(tmp_path: Path, draw: int, extra: Sequence[str] = ()) -> dict[str, float | str]:
    """Train the fixture's recipe on one draw (training seed = draw) and score it, the momentum
    rule chosen on its training span and the Bayes filter on the same held-out days."""
    path = write_market(rotating_market(period=20, seed=draw), tmp_path / f"draw{draw}.csv")
    overrides = [*ROTATION, *SHARED, *SHARED_ROTATION, f"seed={draw}", *extra]
    run = train(config(path, 20_000, overrides), tmp_path / f"run{draw}")
    data = load_dataset(str(path))
    assets = run.validation["td3"].settings["assets"]
    choice, momentum = momentum_for(run.config, data, assets)
    ceiling = held_out_rule(run.config, data, assets, RotationFilter())
    policy = run.validation["td3"].metrics()
    return {
        "draw": draw,
        "policy_sharpe": policy["sharpe"],
        "policy_turnover": policy["turnover"],
        "momentum_rule": repr(choice.rule),
        "momentum_sharpe": momentum.metrics()["sharpe"],
        "filter_sharpe": ceiling.metrics()["sharpe"],
        "excess": policy["sharpe"] - momentum.metrics()["sharpe"],
    }


def test_shared_tilt_stays_ahead_of_the_momentum_rule_on_average_over_draws_5_to_9(tmp_path):
    """Mean over draws 5-9 of (held-out Sharpe - that draw's momentum rule) > 0, net of the
    same costs on the same held-out days; the Bayes filter's figure is printed beside each
    draw as the ceiling it is read against."""
    table = [judge_draw(tmp_path, draw) for draw in FRESH_DRAWS]
    mean_excess = float(np.mean([row["excess"] for row in table]))
    print(json.dumps({"draws": table, "mean_excess": mean_excess}, indent=2))
    assert mean_excess > 0, table
