"""A policy of your own in a backtest, next to the built-in baselines.

A policy is any callable that takes a ``DecisionContext`` (the decision date, the closes up to
it, the current drifted weights) and returns target weights over the slots, cash first. This
one holds inverse-volatility weights over the trailing ``--lookback`` days and keeps a fixed
cash share; ``run_backtest`` runs it with the environment's own accounting (drift, costs out of
NAV), so its figures compare directly with equal weight's and HRP's.

    python examples/custom_baseline.py --out runs/examples/custom_baseline
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from allocator.trainer.market.data import load_sp500
from allocator.trainer.sim.backtest import PolicyLike, run_backtest
from allocator.trainer.sim.baselines import DecisionContext
from allocator.trainer.sim.performance import format_table


class InverseVolatility:
    """Weights proportional to 1 / trailing volatility, with ``cash`` kept aside."""

    name = "inverse-volatility"

    def __init__(self, lookback: int = 60, cash: float = 0.1) -> None:
        self.lookback = lookback
        self.cash = cash

    def __call__(self, ctx: DecisionContext) -> NDArray[np.float64]:
        closes = ctx.prices[-(self.lookback + 1) :]  # (days, assets), up to the decision date
        returns = np.diff(np.log(closes), axis=0)
        vol = returns.std(axis=0) if len(returns) > 1 else np.ones(len(ctx.assets))
        inverse = 1.0 / np.maximum(vol, 1e-8)
        assets = (1.0 - self.cash) * inverse / inverse.sum()
        return ctx.slot_weights(assets, cash=self.cash)  # cash first, sums to 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/examples/custom_baseline"))
    parser.add_argument("--assets", default="AAPL,MSFT,JPM,XOM,JNJ,KO")
    parser.add_argument("--start", default="2018-01-01")
    parser.add_argument("--end", default="2019-12-31")
    parser.add_argument("--lookback", type=int, default=60)
    parser.add_argument("--cost-bps", type=float, default=10.0)
    args = parser.parse_args(argv)

    data = load_sp500()
    assets = args.assets.split(",")
    # a policy object, or the name of a built-in baseline
    policies: list[PolicyLike] = [InverseVolatility(lookback=args.lookback), "equal-weight", "hrp"]
    results = {}
    for policy in policies:
        result = run_backtest(
            policy,
            data,
            args.start,
            args.end,
            assets=assets,
            cost_bps=args.cost_bps,
            window=args.lookback,
        )
        results[result.name] = result
    table = {name: r.metrics() for name, r in results.items()}
    print(format_table(table))

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "metrics.json"
    path.write_text(json.dumps(table, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
