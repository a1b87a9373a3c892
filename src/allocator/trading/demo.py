"""The trading leg of ``allocator demo``: paper-trade the exported model over the validation
days through the real server, then compare the account with the backtest of the same bars."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from prometheus_client import CollectorRegistry
from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from allocator.metrics.trading import TradingMetrics
from allocator.recording.schema import Price
from allocator.serving.client import AllocatorClient
from allocator.serving.demo import local_server
from allocator.trading.book import AccountSpec, create_account
from allocator.trading.compare import Comparison, compare_account
from allocator.trading.cycle import run_cycle
from allocator.trading.paper import PaperBroker
from allocator.trading.sizing import SizingRules

ACCOUNT = "demo"
CASH = 1_000_000.0


def paper_trade_demo(
    registry: Path,
    out_dir: Path,
    dates: Sequence[dt.date],
    prices: NDArray[np.float64],
    assets: Sequence[str],
    start: dt.date,
    end: dt.date,
    *,
    n_assets: int = 5,
    echo: Callable[[str], None] = print,
) -> Comparison:
    """Paper-trade the registry's default model on the bars from ``start`` to ``end``."""
    db = out_dir / "paper.db"
    db.unlink(missing_ok=True)  # a rerun of the demo starts its account afresh
    server = local_server(registry, out_dir, db.name, "paper-spool")
    engine = create_engine(f"sqlite:///{db}", poolclass=NullPool)
    try:
        model = server.registry.snapshot.default
        bars = [d for d in dates if start <= d <= end]
        if not bars:
            raise ValueError(f"no bars between {start} and {end}")
        first = list(dates).index(bars[0])
        last = list(dates).index(bars[-1])
        lo = first - model.prices_per_asset
        if lo < 0:
            raise ValueError(f"{start} needs {model.prices_per_asset} closes before it")
        span = prices[lo : last + 1]
        usable = [j for j in range(span.shape[1]) if np.all(np.isfinite(span[:, j]))]
        chosen = usable[: min(n_assets, model.max_request_assets)]
        names = [assets[j] for j in chosen]
        with Session(engine) as session, session.begin():
            for k in range(lo, last + 1):
                for j, name in zip(chosen, names, strict=True):
                    session.add(
                        Price(asset=name, date=dates[k], close=float(prices[k, j]), source="demo")
                    )
        rules = SizingRules(cost_bps=model.manifest.cost_bps)
        broker = PaperBroker(engine, rules.cost_bps)
        with Session(engine) as session, session.begin():
            create_account(session, AccountSpec(ACCOUNT, names, rules), CASH)
            broker.fund_in(session, ACCOUNT, CASH)
        echo(
            f"paper trading {model.name}/{model.version} on {len(bars)} validation bars "
            f"({bars[0]} .. {bars[-1]}), {', '.join(names)}, {rules.cost_bps:g} bps, "
            f"recording to {db}"
        )
        metrics = TradingMetrics(CollectorRegistry())
        with AllocatorClient(server.target) as client:
            for bar_date in bars:
                run_cycle(engine, broker, client, ACCOUNT, bar_date, metrics=metrics)
    finally:
        server.stop()
    try:
        report = compare_account(engine, ACCOUNT, registry)
    finally:
        engine.dispose()
    echo(report.summary())
    return report
