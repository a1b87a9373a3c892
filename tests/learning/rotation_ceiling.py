"""How much room the rotating market leaves above its momentum bar: a ceiling, no training.

The learning test asks the shared policy to beat, on held-out days, the best top-k momentum
rule chosen on the training span. This script scores, on the same held-out days, costs and
smoothing, that rule and the Bayes filter of the market's own model
(``tests.learning.yardsticks.RotationFilter``: it knows the drift, the noise and how often the
leader is redrawn, which no policy is told), holding its most probable leader or its posterior.
Where the filter barely clears the rule, or does not, knowing the market's model earns little
or nothing over the bar, and a policy's shortfall against it is read in that light.

Usage (from the repository root; prints one JSON document, about 20 seconds):
  python -m tests.learning.rotation_ceiling --draws 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from allocator.trainer.market.data import load_dataset
from allocator.trainer.sim.backtest import BacktestResult
from allocator.trainer.sim.rule_selection import MomentumChoice
from tests.learning.test_learning import config
from tests.learning.test_shared_policy import SHARED
from tests.learning.test_shared_rotation import ROTATION, SHARED_ROTATION
from tests.learning.yardsticks import RotationFilter, held_out_rule, momentum_for
from tests.markets import rotating_market, write_market


def bar_and_ceilings(
    draw: int, books: tuple[str, ...] = ("leader", "posterior")
) -> tuple[MomentumChoice, dict[str, BacktestResult]]:
    """The momentum rule chosen on ``draw``'s training span and the Bayes filter (one result per
    ``book``), on its held-out days with the rotating recipe's costs and smoothing: no policy."""
    with tempfile.TemporaryDirectory() as tmp:
        path = write_market(rotating_market(period=20, seed=draw), Path(tmp) / "market.csv")
        cfg = config(path, 1, [*ROTATION, *SHARED, *SHARED_ROTATION])
        data = load_dataset(str(path))
    assets = list(data.assets)
    choice, momentum = momentum_for(cfg, data, assets)
    results = {"momentum": momentum}
    for book in books:
        results[f"filter_{book}"] = held_out_rule(cfg, data, assets, RotationFilter(book=book))
    return choice, results


def _draw(draw: int) -> dict[str, object]:
    choice, results = bar_and_ceilings(draw)
    out: dict[str, object] = {"draw": draw, "momentum_rule": repr(choice.rule)}
    for name, result in results.items():
        metrics = result.metrics()
        out[name] = {k: round(float(metrics[k]), 4) for k in ("sharpe", "turnover")}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = parser.parse_args()
    json.dump([_draw(d) for d in args.draws], sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
