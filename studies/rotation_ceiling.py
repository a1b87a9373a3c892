"""How much room the rotating market leaves above its momentum bar: a ceiling, no training.

The learning test asks the shared policy to beat, on held-out days, the best top-k momentum
rule chosen on the training span. This script scores, on the same held-out days, costs and
smoothing, that rule and the Bayes filter of the market's own model
(``tests.learning.yardsticks.RotationFilter``: it knows the drift, the noise and how often the
leader is redrawn, which no policy is told), holding its most probable leader or its posterior.
Where the filter barely clears the rule, or does not, knowing the market's model earns little
or nothing over the bar, and a policy's shortfall against it is read in that light.

Usage (from the repository root; prints one JSON document, about 20 seconds):
  python -m studies.rotation_ceiling --draws 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import json
import sys

from tests.learning.rotation import bar_and_ceilings


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
