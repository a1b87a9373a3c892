"""A seed ensemble on the rotating market, judged against the momentum rule on fresh draws.

Over 32 fresh draws (10-41, ``studies/rotation_many_draws.py``) one run of the fixture's recipe
is at -0.15 [-0.36, +0.06] against the momentum rule chosen on the training span, and trades 0.25 of
the book a day against the rule's 0.13-0.19; the Bayes filter of the market's own model is at
+0.37 [+0.15, +0.57]. Part of that gap is one seed's idiosyncrasy: a score that wanders
between two assets on noise moves the book (and pays costs) on nothing. Averaging the
deterministic actions of policies trained with other seeds keeps what they agree on and
damps what each learned by chance; it is the ensemble ``allocator export-ensemble`` serves.

The rule, written and committed before any of its runs:

- ``ensemble-3``: the mean of the deterministic actions of three runs of the fixture's recipe
  (20,000 steps, 10 bps), seeds draw, draw + 1000 and draw + 2000, backtested on the held-out
  days as one policy; ``control``: the run with seed = draw alone (the recipe judged so far).
- Stage one chooses on the development draws 1-4 only: the candidate with the higher mean
  excess (held-out Sharpe - that draw's momentum rule's, net of the same costs) wins; a tie
  keeps ``control``.
- Stage two judges the winner on the sixteen fresh draws 42-57, by
  ``tests.learning.rotation.verdict``'s reading of the 95% BCa interval of the mean excess over
  draws: *beats* above zero, *matches* holding zero, *loses* below. ``control`` comes out of
  the same runs (member one), so its figure on 42-57 is printed too, as a replication of the
  32 draws, not as a second candidate.

Results: RESULTS.md, "Rotating market: the three-seed ensemble". A new candidate needs draws
from 60 on (``tests.learning.rotation.USED``).

Training and judging are apart, so members can be trained wherever there are cores (``train``:
one process per member, each member's run directory kept) and the ensembles judged where they
were gathered (``judge``: loads the members, a few seconds a draw). Usage, from the repository
root:
  python -m studies.rotation_ensemble train --draws 1 2 3 4 --out runs/ens --workers 2
  python -m studies.rotation_ensemble judge --out runs/ens --draws 1 2 3 4 > stage1.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from tests.learning.rotation import (
    DEVELOPMENT_DRAWS,
    MEMBER_OFFSETS,
    ensemble_draws_refused,
    judge_ensemble,
    summarize,
    train_member,
)


def _rows(rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """One candidate's figures in ``summarize``'s shape."""
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
    refused = ensemble_draws_refused(args.draws)
    if refused:
        parser.error(refused)
    (_train if args.command == "train" else _judge)(args)


if __name__ == "__main__":
    main()
