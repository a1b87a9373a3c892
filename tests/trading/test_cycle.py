"""The trading cycle end to end against a real server, on SQLite and Postgres."""

from __future__ import annotations

import socket
import time

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, delete, func, select, text, update
from sqlalchemy.orm import Session

from allocator.metrics.trading import TradingMetrics
from allocator.portfolio import CASH_ID
from allocator.recording.schema import (
    AccountNav,
    Fill,
    Order,
    PaperHolding,
    Position,
    Price,
    TradeCycle,
)
from allocator.serving.client import AllocatorClient
from allocator.trading.book import AccountSpec, create_account
from allocator.trading.broker import OrderRequest
from allocator.trading.cycle import Retries, run_cycle
from allocator.trading.errors import (
    AccountHaltedError,
    BrokerRejectedError,
    MissingPriceError,
    ReconciliationError,
    ServerUnavailableError,
    StaleBarError,
    UnknownAccountError,
)
from allocator.trading.ids import client_order_id
from allocator.trading.paper import PaperBroker
from allocator.trading.sizing import SizingRules
from tests.trading.conftest import ASSETS, N_BARS, bar

CASH = 100_000.0
TABLES = (TradeCycle, Order, Fill, Position, AccountNav, PaperHolding)


def open_account(engine: Engine, name: str = "acct", **rules: float) -> PaperBroker:
    spec = AccountSpec(name, list(ASSETS), SizingRules(**rules))
    broker = PaperBroker(engine, spec.rules.cost_bps)
    with Session(engine) as session, session.begin():
        create_account(session, spec, CASH)
        broker.fund_in(session, name, CASH)
    return broker


def counts(engine: Engine) -> dict[str, int]:
    with Session(engine) as session:
        return {
            t.__tablename__: session.scalar(select(func.count()).select_from(t)) for t in TABLES
        }


def test_a_cycle_trades_records_the_chain_and_a_rerun_changes_nothing(
    engine: Engine, client: AllocatorClient
) -> None:
    broker = open_account(engine)
    metrics = TradingMetrics(CollectorRegistry())
    result = run_cycle(engine, broker, client, "acct", bar(10), metrics=metrics)
    assert result.outcome == "done"
    assert result.orders
    assert all(o["status"] == "filled" and o["side"] == "buy" for o in result.orders)
    assert result.nav_before == CASH
    fees = sum(o["filled"] for o in result.orders)  # quantities bought
    assert fees > 0
    with Session(engine) as session:
        chain = session.execute(
            select(TradeCycle.request_id, Order.client_order_id, Fill.quantity, Fill.fee)
            .join(Order, Order.cycle_id == TradeCycle.id)
            .join(Fill, Fill.order_id == Order.id)
        ).all()
        assert len(chain) == len(result.orders)
        nav = session.scalar(select(AccountNav.nav).where(AccountNav.bar_date == bar(10)))
        total_fees = sum(row.fee for row in chain)
        assert nav == pytest.approx(CASH - total_fees, rel=1e-12)
        book = {p.asset: p.quantity for p in session.scalars(select(Position))}
    assert book == pytest.approx(broker.holdings("acct"))
    before = counts(engine)
    again = run_cycle(engine, broker, client, "acct", bar(10), metrics=metrics)
    assert again.outcome == "already done"
    assert again.orders == result.orders
    assert again.nav_after == result.nav_after
    assert counts(engine) == before
    nxt = run_cycle(engine, broker, client, "acct", bar(11), metrics=metrics)
    assert nxt.nav_before != CASH  # valued at the next bar's closes
    with pytest.raises(Exception, match="cycles run forward in time"):
        run_cycle(engine, broker, client, "acct", bar(9), metrics=metrics)


def test_the_decision_is_stamped_with_its_bar_and_prices(
    engine: Engine, client: AllocatorClient
) -> None:
    """The server records into the same database, off the request path; once its row is there,
    the cycle (or its rerun) stamps it with the bar and the digest of the closes it saw."""
    broker = open_account(engine)
    run_cycle(engine, broker, client, "acct", bar(10))
    query = text("SELECT market_date, prices_digest FROM decisions WHERE request_id = :r")
    with Session(engine) as session:
        cycle = session.scalar(select(TradeCycle))
        deadline = time.monotonic() + 20
        while session.execute(query, {"r": cycle.request_id}).first() is None:
            assert time.monotonic() < deadline, "the server never recorded the decision"
            time.sleep(0.05)
            session.rollback()
    run_cycle(engine, broker, client, "acct", bar(10))
    with Session(engine) as session:
        row = session.execute(query, {"r": cycle.request_id}).one()
    assert str(row.market_date) == bar(10).isoformat()
    assert row.prices_digest == cycle.prices_digest


def test_a_crash_after_submitting_fills_each_order_once(
    engine: Engine, client: AllocatorClient
) -> None:
    """Orders recorded and sent, their answers never recorded: the restart finishes the cycle."""
    broker = open_account(engine)
    run_cycle(engine, broker, client, "acct", bar(10))
    with Session(engine) as session, session.begin():
        # Undo the book's record of the cycle as if the process died right after submitting.
        cycle = session.scalar(select(TradeCycle))
        cycle.status = "submitting"
        session.execute(delete(AccountNav))
        session.execute(delete(Fill))
        session.execute(update(Order).values(status="new"))
        session.execute(delete(Position).where(Position.asset != CASH_ID))
        session.execute(update(Position).values(quantity=CASH, cost_basis=CASH))
    paper_before = broker.holdings("acct")
    result = run_cycle(engine, broker, client, "acct", bar(10))
    assert result.outcome == "already done"
    assert broker.holdings("acct") == paper_before  # nothing sent twice
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(Fill)) == len(result.orders)
        assert session.scalar(select(TradeCycle.status)) == "done"
    assert run_cycle(engine, broker, client, "acct", bar(11)).outcome == "done"  # reconciles


def test_an_injected_mismatch_halts_the_account(engine: Engine, client: AllocatorClient) -> None:
    broker = open_account(engine)
    run_cycle(engine, broker, client, "acct", bar(10))
    with Session(engine) as session, session.begin():
        session.execute(
            update(PaperHolding)
            .where(PaperHolding.asset == ASSETS[0])
            .values(quantity=PaperHolding.quantity + 1)
        )
    registry = CollectorRegistry()
    metrics = TradingMetrics(registry)
    with pytest.raises(ReconciliationError, match=f"{ASSETS[0]}: broker"):
        run_cycle(engine, broker, client, "acct", bar(11), metrics=metrics)
    assert (
        registry.get_sample_value(
            "allocator_trading_reconciliation_mismatches_total", {"account": "acct"}
        )
        == 1.0
    )
    with pytest.raises(AccountHaltedError, match="reconciliation mismatch"):
        run_cycle(engine, broker, client, "acct", bar(11), metrics=metrics)
    assert counts(engine)["trade_cycles"] == 1
    failed = {"account": "acct", "outcome": "failed"}
    assert registry.get_sample_value("allocator_trading_cycles_total", failed) == 2.0


def test_bad_input_is_refused_and_records_nothing(engine: Engine, client: AllocatorClient) -> None:
    broker = open_account(engine)
    before = counts(engine)
    with pytest.raises(UnknownAccountError, match=r"unknown account 'nobody'.*acct"):
        run_cycle(engine, broker, client, "nobody", bar(10))
    with pytest.raises(StaleBarError, match=f"no prices for {bar(N_BARS).isoformat()}"):
        run_cycle(engine, broker, client, "acct", bar(N_BARS))
    with pytest.raises(MissingPriceError, match="has 3 closes up to"):
        run_cycle(engine, broker, client, "acct", bar(2))
    assert counts(engine) == before


def test_a_held_asset_without_a_close_stops_the_cycle(
    engine: Engine, client: AllocatorClient
) -> None:
    broker = open_account(engine)
    run_cycle(engine, broker, client, "acct", bar(10))
    with Session(engine) as session, session.begin():
        session.execute(delete(Price).where(Price.asset == ASSETS[1], Price.date == bar(11)))
    before = counts(engine)
    with pytest.raises(MissingPriceError, match=f"no close for {ASSETS[1]} on {bar(11)}"):
        run_cycle(engine, broker, client, "acct", bar(11))
    assert counts(engine) == before


def test_a_broker_rejection_is_recorded_once(engine: Engine, client: AllocatorClient) -> None:
    open_account(engine)
    broker = PaperBroker(engine, 10.0, reject_assets=[ASSETS[2]])
    with pytest.raises(BrokerRejectedError, match=f"buy {ASSETS[2]}: {ASSETS[2]} is not tradable"):
        run_cycle(engine, broker, client, "acct", bar(10))
    before = counts(engine)
    again = run_cycle(engine, broker, client, "acct", bar(10))
    assert again.outcome == "already done"
    assert len(again.rejected) == 1
    assert counts(engine) == before


def test_a_server_that_is_down_is_retried_then_given_up(engine: Engine) -> None:
    broker = open_account(engine)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    waits: list[float] = []
    retries = Retries(attempts=3, backoff_seconds=0.01, sleep=waits.append)
    before = counts(engine)
    with (
        AllocatorClient(f"127.0.0.1:{port}", timeout=0.5, retry=None) as down,
        pytest.raises(ServerUnavailableError, match="did not answer after 3 attempts"),
    ):
        run_cycle(engine, broker, down, "acct", bar(10), retries=retries)
    assert waits == [0.01, 0.02]
    assert counts(engine) == before


def test_client_order_ids_are_deterministic_and_distinct() -> None:
    one = client_order_id("acct", bar(1), "AAA", "buy")
    assert one == client_order_id("acct", bar(1), "AAA", "buy")
    assert (
        len(
            {
                one,
                client_order_id("acct", bar(1), "AAA", "sell"),
                client_order_id("acct", bar(2), "AAA", "buy"),
                client_order_id("acct2", bar(1), "AAA", "buy"),
            }
        )
        == 4
    )
    assert OrderRequest(one, "acct", "AAA", "buy", 1.0, 1.0).client_order_id == one
