"""A seed ensemble on the rotating market, judged against the momentum rule on fresh draws.

Over 32 fresh draws (10-41, ``rotation_many_draws.py``) one run of the fixture's recipe is at
-0.15 [-0.36, +0.06] against the momentum rule chosen on the training span, and trades 0.25 of
the book a day against the rule's 0.13-0.19; the Bayes filter of the market's own model is at
+0.37 [+0.15, +0.57]. Part of that gap is one seed's idiosyncrasy: a score that wanders
between two assets on noise moves the book (and pays costs) on nothing. Averaging the
deterministic actions of policies trained with other seeds keeps what they agree on and
damps what each learned by chance; it is the ensemble ``allocator export-ensemble`` serves.

The rule, written and committed before any of its runs (2026-11-27):

- ``ensemble-3``: the mean of the deterministic actions of three runs of the fixture's recipe
  (20,000 steps, 10 bps), seeds draw, draw + 1000 and draw + 2000, backtested on the held-out
  days as one policy; ``control``: the run with seed = draw alone (the recipe judged so far).
- Stage one chooses on the development draws 1-4 only: the candidate with the higher mean
  excess (held-out Sharpe - that draw's momentum rule's, net of the same costs) wins; a tie
  keeps ``control``.
- Stage two judges the winner on the sixteen fresh draws 42-57, by
  ``rotation_many_draws``' reading of the 95% BCa interval of the mean excess over draws:
  *beats* above zero, *matches* holding zero, *loses* below. ``control`` comes out of the same
  runs (member one), so its figure on 42-57 is printed too, as a replication of the 32 draws,
  not as a second candidate.

Result (2026-11-27, RESULTS.md): ``ensemble-3`` won stage one (+0.29 against +0.01) and on
draws 42-57 it **beats** the rule, +0.32 [+0.12, +0.49], ahead of the rule on 12 of 16 draws
and of the control run on all 16; ``control`` matches the rule, -0.00 [-0.19, +0.15]. A new
candidate needs draws from 60 on (``rotation_many_draws.USED``; 58-59 went to
``test_ensemble_beats_momentum.py``).

Training and judging are apart, so members can be trained wherever there are cores (``train``:
one process per member, each member's run directory kept) and the ensembles judged where they
were gathered (``judge``: loads the members, a few seconds a draw). Usage, from the repository
root:
  python -m tests.learning.rotation_ensemble train --draws 1 2 3 4 --out runs/ens --workers 2
  python -m tests.learning.rotation_ensemble judge --out runs/ens --draws 1 2 3 4 > stage1.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

from allocator.trainer.export.loaded_run import LoadedRun, load_run
from allocator.trainer.market.data import load_dataset
from allocator.trainer.training.policy_eval import backtest_model
from allocator.trainer.training.run import train
from tests.learning.rotation_many_draws import DEVELOPMENT_DRAWS, ENSEMBLE_DRAWS, summarize
from tests.learning.test_learning import config
from tests.learning.test_shared_policy import SHARED
from tests.learning.test_shared_rotation import ROTATION, SHARED_ROTATION
from tests.learning.yardsticks import RotationFilter, SeedEnsemble, held_out_rule, momentum_for
from tests.markets import rotating_market, write_market

MEMBER_OFFSETS = (0, 1000, 2000)
"""Seed offsets of the ensemble's members from the draw; offset 0 is the control run."""


STEPS = 20_000
KEPT = ("manifest.json", "normalization.json", "feature_normalization.json")
"""What ``load_run`` needs of a member besides the files its manifest lists (about 1 MB)."""


def _recipe(seed: int, device: str = "cpu") -> list[str]:
    return [*ROTATION, *SHARED, *SHARED_ROTATION, f"seed={seed}", f"device={device}"]


def member_dir(root: Path, draw: int, offset: int) -> Path:
    return root / f"draw{draw}" / f"seed{draw + offset}"


def train_member(root: Path, draw: int, offset: int, device: str, steps: int = STEPS) -> Path:
    """Train one member of one draw's ensemble and keep what judging it needs."""
    out = member_dir(root, draw, offset)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_market(rotating_market(period=20, seed=draw), Path(tmp) / "market.csv")
        run = train(config(path, steps, _recipe(draw + offset, device)), Path(tmp) / "run")
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
        path = write_market(rotating_market(period=20, seed=draw), Path(tmp) / "market.csv")
        cfg = config(path, STEPS, _recipe(draw))
        data = load_dataset(str(path))
    span = (cfg.data.validation_start, cfg.data.validation_end)

    def held_out(policy_members: Sequence[LoadedRun]) -> Any:
        result, _ = backtest_model(
            SeedEnsemble(policy_members),
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


def _rows(rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """One candidate's figures in ``rotation_many_draws.summarize``'s shape."""
    return [{k: r[k] for k in ("draw", "momentum_sharpe", "filter_sharpe")} | r[name] for r in rows]


def _train(args: argparse.Namespace) -> None:
    jobs = [(d, o) for d in args.draws for o in args.offsets]
    with ProcessPoolExecutor(args.workers) as pool:
        futures = [pool.submit(train_member, args.out, d, o, args.device) for d, o in jobs]
        for future in as_completed(futures):
            print(future.result(), file=sys.stderr, flush=True)


def _judge(args: argparse.Namespace) -> None:
    rows = [judge_ensemble(args.out, d) for d in args.draws]
    out: dict[str, Any] = {"rows": rows}
    for name in ("control", "ensemble-3"):
        out[name] = summarize(_rows(rows, name))
    if set(args.draws) <= set(DEVELOPMENT_DRAWS):
        means = {name: out[name]["mean_excess"] for name in ("control", "ensemble-3")}
        out["chosen"] = "ensemble-3" if means["ensemble-3"] > means["control"] else "control"
    json.dump(out, sys.stdout, indent=2)
    print()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("train", "judge"):
        p = sub.add_parser(name)
        p.add_argument("--out", type=Path, required=True, help="members' folder")
        p.add_argument("--draws", type=int, nargs="+", required=True)
    sub.choices["train"].add_argument("--offsets", type=int, nargs="+", default=MEMBER_OFFSETS)
    sub.choices["train"].add_argument("--workers", type=int, default=2)
    sub.choices["train"].add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    allowed = {*DEVELOPMENT_DRAWS, *ENSEMBLE_DRAWS}
    if not set(args.draws) <= allowed:
        parser.error(f"draws {sorted(set(args.draws) - allowed)}: this study uses 1-4 and 42-57")
    if set(args.draws) & set(DEVELOPMENT_DRAWS) and set(args.draws) & set(ENSEMBLE_DRAWS):
        parser.error("choose on 1-4 and judge on 42-57 in separate calls")
    (_train if args.command == "train" else _judge)(args)


if __name__ == "__main__":
    main()
