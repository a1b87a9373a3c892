"""One run of the fixture's recipe on a fresh draw of the rotating market, scored beside that
draw's momentum rule and Bayes filter: ``judge_draw``, which ``rotation_many_draws.py`` calls
draw by draw; ``FRESH_DRAWS``, which both sweeps refuse.

Until 2026-11-28 this module was a CI test: averaged over draws 5-9 (registered before any of
them was generated, training seed = draw), the policy's held-out Sharpe net of 10 bps had to
beat that draw's best top-k momentum rule chosen on its training span. It passed (+0.13, ahead
on 2 of 5), but five single-seed draws are too few to judge, and over 48 later fresh draws
(10-57) the same single seed is at -0.10 against the rule (RESULTS.md). What carries the
comparison now is the three-seed ensemble: over draws 42-57 it beats the rule, +0.32 [+0.12,
+0.49] (``rotation_ensemble.py``), and CI runs it on a fresh draw
(``test_ensemble_beats_momentum.py``, three runs against this test's five). Draws 5-9 stay
refused to every development sweep.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from allocator.trainer.market.data import load_dataset
from allocator.trainer.training.run import train
from tests.learning.test_learning import config
from tests.learning.test_shared_policy import SHARED
from tests.learning.test_shared_rotation import ROTATION, SHARED_ROTATION
from tests.learning.yardsticks import RotationFilter, held_out_rule, momentum_for
from tests.markets import rotating_market, write_market

FRESH_DRAWS = (5, 6, 7, 8, 9)
"""Fresh draws of the retired test: never used to choose anything (the sweeps refuse them)."""


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
