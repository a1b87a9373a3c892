"""The rotating market's judges and its ledger of draws, shared by the learning tests and the
studies in ``studies/`` (which ask the same questions over many draws).

- The ledger: which draws of ``rotating_market(period=20, seed=draw)`` chose a recipe or already
  judged one (``USED``), so that no study chooses on a draw a test or a study judges on.
- ``bar_and_ceilings``: on a draw's held-out days, the momentum rule chosen on its training span
  (the bar a policy must clear) and the Bayes filter of the market's own model (how much room
  knowing the model leaves above the bar); no training.
- ``judge_draw``: one run of the fixture's recipe on a draw, scored beside the bar and filter.
- ``train_member`` and ``judge_ensemble``: the three-seed ensemble, trained member by member and
  judged as one policy (its members' deterministic actions averaged, as served).
- ``interval``, ``verdict`` and ``summarize``: the 95% BCa bootstrap interval of the mean excess
  over independent draws and its pre-registered reading (beats, matches, loses).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from arch.bootstrap import IIDBootstrap

from allocator.trainer.export.loaded_run import LoadedRun, load_run
from allocator.trainer.market.data import load_dataset
from allocator.trainer.sim.backtest import BacktestResult
from allocator.trainer.sim.rule_selection import MomentumChoice
from allocator.trainer.training.policy_eval import SeedEnsemble, backtest_model
from allocator.trainer.training.run import train
from tests.learning.recipes import ROTATION, SHARED, SHARED_ROTATION, config
from tests.learning.yardsticks import RotationFilter, held_out_rule, momentum_for
from tests.markets import rotating_market, write_market

# The ledger of draws.

DEVELOPMENT_DRAWS = (1, 2, 3, 4)
"""Where recipes are chosen (``studies/rotation_dev_sweep.py`` chose the fixture's there)."""

FRESH_DRAWS = (5, 6, 7, 8, 9)
"""A retired five-draw CI test's: too few to judge (``RESULTS.md``), never used to choose."""

MANY_DRAWS = tuple(range(10, 26))
"""Where ``studies/rotation_many_draws.py`` judged the recipe: generated after its rule."""

CHOSEN_DRAWS = tuple(range(26, 42))
"""Where the first ``--choose-among`` run's winner was judged."""

JUDGED = {*MANY_DRAWS, *CHOSEN_DRAWS}
"""Draws that judged a recipe and chose nothing: the same recipe may run there again (a
replication), a new one may not."""

ENSEMBLE_DRAWS = tuple(range(42, 58))
"""Where ``studies/rotation_ensemble.py`` judged the three-seed ensemble chosen on 1-4."""

CI_DRAWS = (58, 59)
"""Scanned for ``test_ensemble_beats_momentum.py``'s draw: 58 failed its market criterion, 59
is the test's draw."""

USED = {0, *DEVELOPMENT_DRAWS, *FRESH_DRAWS, *JUDGED, *ENSEMBLE_DRAWS, *CI_DRAWS}
"""Draws that chose a recipe (1-4) or already judged one (0, 5-59): a new candidate needs draws
from 60 on."""

TEST_DRAWS = {0, *FRESH_DRAWS, *CI_DRAWS}
"""The learning tests' markets (``test_adaptive_smoothness`` and
``studies/rotation_representation.py``: 0; ``test_ensemble_beats_momentum``: 58-59, scanned for
its draw) and a retired test's (5-9)."""


def recipe(seed: int, device: str = "cpu", extra: Sequence[str] = ()) -> list[str]:
    """The fixture's shared-policy recipe on the rotating market at ``seed``."""
    return [*ROTATION, *SHARED, *SHARED_ROTATION, f"seed={seed}", f"device={device}", *extra]


def draw_market(draw: int, folder: Path, name: str = "market.csv") -> Path:
    """Write draw ``draw`` of the rotating market (20-day regimes) to ``folder / name``."""
    return write_market(rotating_market(period=20, seed=draw), folder / name)


# The bar, the ceiling and one run.


def bar_and_ceilings(
    draw: int, books: tuple[str, ...] = ("leader", "posterior")
) -> tuple[MomentumChoice, dict[str, BacktestResult]]:
    """The momentum rule chosen on ``draw``'s training span and the Bayes filter (one result per
    ``book``), on its held-out days with the rotating recipe's costs and smoothing: no policy."""
    with tempfile.TemporaryDirectory() as tmp:
        path = draw_market(draw, Path(tmp))
        cfg = config(path, 1, [*ROTATION, *SHARED, *SHARED_ROTATION])
        data = load_dataset(str(path))
    assets = list(data.assets)
    choice, momentum = momentum_for(cfg, data, assets)
    results = {"momentum": momentum}
    for book in books:
        results[f"filter_{book}"] = held_out_rule(cfg, data, assets, RotationFilter(book=book))
    return choice, results


def judge_draw(tmp_path: Path, draw: int, extra: Sequence[str] = ()) -> dict[str, float | str]:
    """Train the fixture's recipe on one draw (training seed = draw) and score it, the momentum
    rule chosen on its training span and the Bayes filter on the same held-out days."""
    path = draw_market(draw, tmp_path, f"draw{draw}.csv")
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


# The seed ensemble.

MEMBER_OFFSETS = (0, 1000, 2000)
"""Seed offsets of the ensemble's members from the draw; offset 0 is the control run."""

STEPS = 20_000
KEPT = ("manifest.json", "normalization.json", "feature_normalization.json")
"""What ``load_run`` needs of a member besides the files its manifest lists (about 1 MB)."""


def member_dir(root: Path, draw: int, offset: int) -> Path:
    return root / f"draw{draw}" / f"seed{draw + offset}"


def train_member(root: Path, draw: int, offset: int, device: str, steps: int = STEPS) -> Path:
    """Train one member of one draw's ensemble and keep what judging it needs."""
    out = member_dir(root, draw, offset)
    with tempfile.TemporaryDirectory() as tmp:
        path = draw_market(draw, Path(tmp))
        run = train(config(path, steps, recipe(draw + offset, device)), Path(tmp) / "run")
        out.mkdir(parents=True, exist_ok=True)
        listed = json.loads((run.run_dir / "manifest.json").read_text())["files"]
        for name in (*KEPT, *listed):
            if (run.run_dir / name).is_file():
                (out / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(run.run_dir / name, out / name)
    return out


def _same_statistics(a: LoadedRun, b: LoadedRun) -> bool:
    pairs = [(a.stats.mean, b.stats.mean), (a.stats.std, b.stats.std)]
    if a.feature_norm is not None and b.feature_norm is not None:
        pairs += [
            (a.feature_norm.mean, b.feature_norm.mean),
            (a.feature_norm.std, b.feature_norm.std),
        ]
    elif (a.feature_norm is None) != (b.feature_norm is None):
        return False
    return all(np.allclose(x, y, rtol=1e-9, atol=1e-15) for x, y in pairs)


def judge_ensemble(root: Path, draw: int) -> dict[str, Any]:
    """Backtest control and the ensemble of one draw on its held-out days, beside the
    momentum rule chosen on its training span and the Bayes filter."""
    members = [load_run(member_dir(root, draw, offset)) for offset in MEMBER_OFFSETS]
    first = members[0]
    for m in members[1:]:  # same market, same span: the fitted statistics must agree (to
        # the last bits another machine's numpy sums differently)
        if not _same_statistics(m, first):
            raise ValueError(f"draw {draw}: {m.run_dir} was fitted on other prices")
    with tempfile.TemporaryDirectory() as tmp:
        path = draw_market(draw, Path(tmp))
        cfg = config(path, STEPS, recipe(draw))
        data = load_dataset(str(path))
    span = (cfg.data.validation_start, cfg.data.validation_end)

    def held_out(policy_members: Sequence[LoadedRun]) -> Any:
        result, _ = backtest_model(
            SeedEnsemble([m.model for m in policy_members]),
            cfg,
            data,
            span,
            first.stats,
            first.feature_norm,  # type: ignore[arg-type]
        )
        return result

    control, ensemble = held_out(members[:1]), held_out(members)
    sharpes = [float(m.manifest.metrics["td3"]["sharpe"]) for m in members]  # training's own
    if not np.isclose(control.metrics()["sharpe"], sharpes[0], atol=1e-9):
        raise RuntimeError(
            f"draw {draw}: the replayed control ({control.metrics()['sharpe']}) is not the "
            f"run's own validation ({sharpes[0]}): the judge does not replay training's"
        )
    assets = control.settings["assets"]
    choice, momentum = momentum_for(cfg, data, assets)
    ceiling = held_out_rule(cfg, data, assets, RotationFilter())
    rule = momentum.metrics()["sharpe"]
    row = {
        "draw": draw,
        "momentum_rule": repr(choice.rule),
        "momentum_sharpe": rule,
        "filter_sharpe": ceiling.metrics()["sharpe"],
        "member_sharpes": sharpes,
    }
    for name, result in (("control", control), ("ensemble-3", ensemble)):
        m = result.metrics()
        row[name] = {
            "policy_sharpe": m["sharpe"],
            "policy_turnover": m["turnover"],
            "excess": m["sharpe"] - rule,
        }
    return row


def ensemble_draws_refused(draws: Iterable[int]) -> str | None:
    """Why the ensemble study may not run on ``draws`` (None: it may): it chooses on 1-4 and
    judges on 42-57, each in a call of its own."""
    draws = set(draws)
    allowed = {*DEVELOPMENT_DRAWS, *ENSEMBLE_DRAWS}
    if not draws <= allowed:
        return f"draws {sorted(draws - allowed)}: this study uses 1-4 and 42-57"
    if draws & set(DEVELOPMENT_DRAWS) and draws & set(ENSEMBLE_DRAWS):
        return "choose on 1-4 and judge on 42-57 in separate calls"
    return None


# Reading many draws.


def interval(values: list[float], seed: int = 0) -> tuple[float, float]:
    """95% BCa bootstrap interval of the mean over independent draws (a point where every draw
    gives the same figure: BCa has no spread to correct)."""
    x = np.asarray(values, dtype=np.float64)
    if np.ptp(x) == 0:
        return float(x[0]), float(x[0])
    boot = IIDBootstrap(x, seed=seed)
    low, high = boot.conf_int(np.mean, reps=10_000, method="bca")[:, 0]
    return float(low), float(high)


def verdict(low: float, high: float) -> str:
    """The pre-registered reading of the interval: above zero beats, below loses, else matches."""
    return "beats" if low > 0 else ("loses" if high < 0 else "matches")


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean excess over the rule with its interval and verdict, the filter's room, turnover."""
    excess = [float(r["excess"]) for r in rows]
    ceiling = [float(r["filter_sharpe"]) - float(r["momentum_sharpe"]) for r in rows]
    low, high = interval(excess)
    return {
        "draws": len(rows),
        "mean_excess": float(np.mean(excess)),
        "interval_95": [low, high],
        "verdict": verdict(low, high),
        "policy_ahead": int(sum(e > 0 for e in excess)),
        "filter_mean_excess_over_rule": float(np.mean(ceiling)),
        "filter_interval_95": list(interval(ceiling)),
        "policy_mean_turnover": float(np.mean([float(r["policy_turnover"]) for r in rows])),
    }
