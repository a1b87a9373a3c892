"""Trading accounts for the live Prometheus test: real cycles against a real server, their
figures read back from the trade database as ``allocator trade`` pushes them.

Three paper accounts trade a few bars against the healthy server: ``steady`` tracks its backtest,
``slipping`` pays a broker's 5% slippage and drifts off it (``AllocatorTradingTrackingDifference``),
and ``broken`` has a position injected at its broker, so its next cycle halts it
(``AllocatorTradingAccountHalted``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import create_engine, update
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from allocator.metrics.trading import TRADE_JOB, TradingMetrics
from allocator.recording.migrations import upgrade
from allocator.recording.schema import PaperHolding
from allocator.serving.client import AllocatorClient
from allocator.trading.book import AccountSpec, create_account
from allocator.trading.compare import compare_account
from allocator.trading.cycle import run_cycle
from allocator.trading.errors import ReconciliationError
from allocator.trading.paper import PaperBroker
from allocator.trading.sizing import SizingRules
from allocator.trading.status import account_status
from tests.trading.conftest import ASSETS, bar, insert_prices, synthetic_closes

BARS = range(6, 14)
"""Bars with the tiny model's window (5) of history behind them."""
SLIPPAGE_BPS = 500.0


def trading_registries(
    tmp: Path, server_target: str, registry: Path
) -> list[tuple[str, CollectorRegistry, dict[str, str]]]:
    """``(job, registry, grouping key)`` per account, after its cycles and comparison."""
    tmp.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{tmp / 'trade.db'}"
    upgrade(url)
    engine = create_engine(url, poolclass=NullPool)
    insert_prices(engine, synthetic_closes())
    pushes = {n: TradingMetrics(CollectorRegistry()) for n in ("steady", "slipping", "broken")}
    try:
        with AllocatorClient(server_target, timeout=10.0) as client:
            for name, metrics in pushes.items():
                rules = SizingRules()
                slippage = SLIPPAGE_BPS if name == "slipping" else 0.0
                broker = PaperBroker(engine, rules.cost_bps, slippage_bps=slippage)
                with Session(engine) as session, session.begin():
                    create_account(session, AccountSpec(name, list(ASSETS), rules), 100_000.0)
                    broker.fund_in(session, name, 100_000.0)
                for k in BARS:
                    run_cycle(engine, broker, client, name, bar(k), metrics=metrics)
                if name == "broken":
                    with Session(engine) as session, session.begin():
                        session.execute(
                            update(PaperHolding)
                            .where(PaperHolding.account == name, PaperHolding.asset == ASSETS[0])
                            .values(quantity=PaperHolding.quantity + 1)
                        )
                    with pytest.raises(ReconciliationError):
                        run_cycle(engine, broker, client, name, bar(BARS[-1] + 1), metrics=metrics)
                else:
                    report = compare_account(engine, name, registry)
                    metrics.record_tracking(name, report.tracking_difference)
                (entry,) = account_status(engine, name)
                metrics.record_book(entry)
    finally:
        engine.dispose()
    return [(TRADE_JOB, m.registry, {"account": n}) for n, m in pushes.items()]
