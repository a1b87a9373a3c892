"""Live against backtest over 260 bars of the embedded S&P 500 data, on SQLite and Postgres.

A fractional paper account without band, minimum or buffer trades what the serving-path
backtest trades: its final NAV lands within 0.1% of the replay of the same model over the same
bars. An account with round lots and a minimum order value is reported with how far its rules
kept the book from the target, and trades less.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from allocator.cli import main
from allocator.metrics.trading import TradingMetrics
from allocator.recording.migrations import upgrade
from allocator.recording.schema import (
    AccountNav,
    Decision,
    Fill,
    Order,
    Position,
    Price,
    TradeCycle,
)
from allocator.serving.client import AllocatorClient
from allocator.trading.book import AccountSpec, create_account
from allocator.trading.compare import compare_account
from allocator.trading.cycle import run_cycle
from allocator.trading.errors import TradingError
from allocator.trading.paper import PaperBroker
from allocator.trading.sizing import SizingRules
from tests.recording.conftest import database_url  # noqa: F401 - the fixture, per backend

ASSETS = ("AAPL", "JPM", "XOM")
WINDOW = 5
BARS = 260
CASH = 1_000_000.0


def embedded_closes() -> tuple[list[dt.date], np.ndarray]:
    """The last ``BARS + WINDOW`` closes of three assets of the embedded S&P 500 data."""
    from allocator.trainer.market.data import load_sp500

    md = load_sp500()
    columns = [md.assets.index(a) for a in ASSETS]
    rows = slice(md.n_dates - BARS - WINDOW, md.n_dates)
    dates = [d.date() for d in md.dates[rows]]
    return dates, md.prices[rows][:, columns]


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:  # noqa: F811 - the imported fixture
    """The migrated trade database with the embedded closes in ``prices``."""
    upgrade(database_url)
    engine = create_engine(database_url, poolclass=NullPool)
    dates, closes = embedded_closes()
    with Session(engine) as session, session.begin():
        for date, row in zip(dates, closes, strict=True):
            for asset, close in zip(ASSETS, row, strict=True):
                session.add(Price(asset=asset, date=date, close=float(close), source="sp500"))
    try:
        yield engine
    finally:
        engine.dispose()


def trade_span(
    engine: Engine, client: AllocatorClient, name: str, rules: SizingRules, bars: int = BARS
) -> list[dt.date]:
    spec = AccountSpec(name, list(ASSETS), rules)
    broker = PaperBroker(engine, rules.cost_bps)
    with Session(engine) as session, session.begin():
        create_account(session, spec, CASH)
        broker.fund_in(session, name, CASH)
    dates, _ = embedded_closes()
    metrics = TradingMetrics(CollectorRegistry())
    span = dates[WINDOW : WINDOW + bars]
    for bar_date in span:
        run_cycle(engine, broker, client, name, bar_date, metrics=metrics)
    return span


def wait_for_decisions(engine: Engine, n: int) -> None:
    """The server records its decisions off the request path: wait until all ``n`` are in."""
    deadline = time.monotonic() + 30
    while True:
        with Session(engine) as session:
            joined = session.scalar(
                select(func.count())
                .select_from(TradeCycle)
                .join(Decision, Decision.request_id == TradeCycle.request_id)
            )
        if joined == n:
            return
        assert time.monotonic() < deadline, f"{joined} of {n} decisions recorded"
        time.sleep(0.1)


def test_paper_nav_tracks_the_backtest_within_a_tenth_of_a_percent(
    engine: Engine, client: AllocatorClient, tmp_path: Path
) -> None:
    span = trade_span(engine, client, "live", SizingRules(cost_bps=10.0))
    report = compare_account(engine, "live", tmp_path / "registry")
    assert report.bars == BARS >= 250
    assert (report.start, report.end) == (span[0].isoformat(), span[-1].isoformat())
    assert abs(report.tracking_difference) < 1e-3, report.summary()
    assert report.max_abs_difference < 1e-3
    assert report.live_nav != CASH  # the model traded and the prices moved
    assert report.live_fees == pytest.approx(report.backtest_costs, rel=1e-2)
    assert report.mean_cash_gap < 1e-6
    wait_for_decisions(engine, BARS)
    with Session(engine) as session:
        # The chain decision -> orders -> fills -> positions -> NAV, joined in SQL.
        chain = session.execute(
            select(TradeCycle.bar_date, Order.client_order_id, Fill.quantity, AccountNav.nav)
            .join(Decision, Decision.request_id == TradeCycle.request_id)
            .join(Order, Order.cycle_id == TradeCycle.id)
            .join(Fill, Fill.order_id == Order.id)
            .join(
                AccountNav,
                (AccountNav.account_id == TradeCycle.account_id)
                & (AccountNav.bar_date == TradeCycle.bar_date),
            )
        ).all()
        assert {row.bar_date for row in chain} >= set(span[:-1])
        fills = session.execute(select(Fill.asset, Fill.side, Fill.quantity)).all()
        for asset in ASSETS:
            bought = sum(f.quantity for f in fills if f.asset == asset and f.side == "buy")
            sold = sum(f.quantity for f in fills if f.asset == asset and f.side == "sell")
            held = session.scalar(select(Position.quantity).where(Position.asset == asset))
            assert held == pytest.approx(bought - sold, abs=1e-9)


def test_lots_and_minimum_orders_show_in_the_report(
    engine: Engine, client: AllocatorClient, tmp_path: Path
) -> None:
    rules = SizingRules(lot_size=100.0, min_order_value=20_000.0)
    trade_span(engine, client, "lots", rules, bars=40)
    report = compare_account(engine, "lots", tmp_path / "registry")
    assert report.mean_cash_gap > 1e-3
    assert report.live_turnover < report.backtest_turnover
    assert "tracking difference" in report.summary()


def test_a_span_with_a_missed_bar_is_refused(
    engine: Engine, client: AllocatorClient, tmp_path: Path
) -> None:
    dates, _ = embedded_closes()
    rules = SizingRules()
    broker = PaperBroker(engine, rules.cost_bps)
    with Session(engine) as session, session.begin():
        create_account(session, AccountSpec("gappy", list(ASSETS), rules), CASH)
        broker.fund_in(session, "gappy", CASH)
    for bar_date in (dates[WINDOW], dates[WINDOW + 2]):
        run_cycle(engine, broker, client, "gappy", bar_date)
    with pytest.raises(TradingError, match="no cycle for 1 bar"):
        compare_account(engine, "gappy", tmp_path / "registry")


def test_the_compare_command_reports_and_writes_json(
    engine: Engine, client: AllocatorClient, tmp_path: Path
) -> None:
    trade_span(engine, client, "desk", SizingRules(), bars=12)
    url = engine.url.render_as_string(hide_password=False)
    out = tmp_path / "compare.json"
    args = ["trade", "compare", "--account", "desk", "--database-url", url]
    done = CliRunner().invoke(
        main, [*args, "--registry", str(tmp_path / "registry"), "--json-out", str(out)]
    )
    assert done.exit_code == 0, done.output
    assert "desk (tiny/1)" in done.output
    assert "tracking difference" in done.output
    report = json.loads(out.read_text())
    assert report["bars"] == 12
    assert len(report["live_path"]) == len(report["backtest_path"]) == 12
    unknown = CliRunner().invoke(
        main, [*args[:3], "nobody", *args[4:], "--registry", str(tmp_path / "registry")]
    )
    assert unknown.exit_code == 1
    assert "unknown account 'nobody'" in unknown.output
