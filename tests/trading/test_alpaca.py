"""The Alpaca adapter with the SDK's own request and response models, against an in-memory
stand-in for Alpaca's REST service (no network: nothing here reaches Alpaca).

The stand-in answers as the service does for the calls the adapter makes: it validates the
SDK's ``MarketOrderRequest``, refuses a second order with the same client order id (HTTP 422),
answers an unknown id with HTTP 404, and returns ``Order``, ``Position`` and ``TradeAccount``
built by the SDK from JSON shaped like Alpaca's.
"""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

pytest.importorskip("alpaca", reason="alpaca-py (the alpaca extra) is not installed")

from alpaca.common.exceptions import APIError
from alpaca.trading.models import Order, Position, TradeAccount
from alpaca.trading.requests import MarketOrderRequest

from allocator.metrics.trading import TradingMetrics
from allocator.portfolio import CASH_ID
from allocator.recording.schema import Fill, Price
from allocator.recording.schema import Order as BookOrder
from allocator.serving.client import AllocatorClient
from allocator.trading.alpaca import AlpacaBroker, BrokerPendingError, to_answer
from allocator.trading.book import AccountSpec, create_account, recorded_holdings
from allocator.trading.broker import FILLED, PARTIAL, REJECTED, OrderRequest
from allocator.trading.cycle import run_cycle
from allocator.trading.sizing import SizingRules
from tests.trading.conftest import ASSETS, bar

CASH = 100_000.0
NOW = "2024-01-11T21:00:00Z"


def api_error(status: int, message: str) -> APIError:
    http = SimpleNamespace(response=SimpleNamespace(status_code=status), request=None)
    return APIError(json.dumps({"code": status * 100, "message": message}), http)


def order_json(request: MarketOrderRequest, status: str, filled: float, price: float | None):
    return {
        "id": str(uuid.uuid4()),
        "client_order_id": request.client_order_id,
        "created_at": NOW,
        "updated_at": NOW,
        "submitted_at": NOW,
        "asset_id": str(uuid.uuid4()),
        "symbol": request.symbol,
        "asset_class": "us_equity",
        "qty": str(request.qty),
        "filled_qty": str(filled),
        "filled_avg_price": None if price is None else str(price),
        "order_class": "simple",
        "order_type": "market",
        "type": "market",
        "side": request.side.value,
        "time_in_force": request.time_in_force.value,
        "status": status,
        "extended_hours": False,
    }


class FakeAlpaca:
    """Alpaca's paper service for one account, in memory: market orders fill at ``prices``."""

    def __init__(self, cash: float, prices: dict[str, float]) -> None:
        self.cash = cash
        self.prices = prices
        self.positions: dict[str, float] = {}
        self.orders: dict[str, dict[str, Any]] = {}
        self.submitted: list[str] = []
        self.open_polls = 0  # answer "accepted" this many times before filling
        self.refuse: set[str] = set()

    def submit_order(self, request: MarketOrderRequest) -> Order:
        assert isinstance(request, MarketOrderRequest)
        if request.client_order_id in self.orders:
            raise api_error(422, "client_order_id must be unique")
        if request.symbol in self.refuse:
            raise api_error(403, f"asset {request.symbol} is not tradable")
        self.submitted.append(request.client_order_id)
        qty, price = float(request.qty), self.prices[request.symbol]
        sign = 1.0 if request.side.value == "buy" else -1.0
        self.positions[request.symbol] = self.positions.get(request.symbol, 0.0) + sign * qty
        self.cash -= sign * qty * price
        self.orders[request.client_order_id] = order_json(request, "filled", qty, price)
        return Order(**{**self.orders[request.client_order_id], "status": "accepted"})

    def get_order_by_client_id(self, client_id: str) -> Order:
        if client_id not in self.orders:
            raise api_error(404, "order not found")
        if self.open_polls > 0:
            self.open_polls -= 1
            return Order(**{**self.orders[client_id], "status": "accepted", "filled_qty": "0"})
        return Order(**self.orders[client_id])

    def get_all_positions(self) -> list[Position]:
        return [
            Position(
                asset_id=str(uuid.uuid4()),
                symbol=symbol,
                exchange="NASDAQ",
                asset_class="us_equity",
                avg_entry_price="1",
                qty=str(qty),
                side="long",
                cost_basis="1",
            )
            for symbol, qty in self.positions.items()
            if qty != 0
        ]

    def get_account(self) -> TradeAccount:
        return TradeAccount(
            id=str(uuid.uuid4()), account_number="PA1", status="ACTIVE", cash=str(self.cash)
        )


def broker(fake: FakeAlpaca, **options: Any) -> AlpacaBroker:
    return AlpacaBroker(fake, sleep=lambda _: None, poll_seconds=0.0, **options)


def request(asset: str = "AAA", side: str = "buy", quantity: float = 2.5) -> OrderRequest:
    return OrderRequest("c" * 32, "acct", asset, side, quantity, 100.0)


def test_submit_sends_once_and_a_resubmission_is_looked_up() -> None:
    fake = FakeAlpaca(CASH, {"AAA": 101.0})
    alpaca = broker(fake)
    first = alpaca.submit(request())
    assert first.status == FILLED
    assert [f.quantity for f in first.fills] == [2.5]
    assert first.fills[0].price == 101.0  # the market's price, not the bar's close
    assert first.fills[0].fee == 0.0
    again = alpaca.submit(request())
    assert again == first
    assert fake.submitted == ["c" * 32]
    assert alpaca.holdings("acct") == {"AAA": 2.5, CASH_ID: CASH - 252.5}


def test_an_open_order_is_waited_for_then_reported_pending() -> None:
    fake = FakeAlpaca(CASH, {"AAA": 100.0})
    fake.open_polls = 3
    assert broker(fake).submit(request()).status == FILLED
    fake = FakeAlpaca(CASH, {"AAA": 100.0})
    fake.open_polls = 100
    with pytest.raises(BrokerPendingError, match="still open"):
        broker(fake, wait_seconds=0.0).submit(request())
    assert fake.submitted == ["c" * 32]  # sent once; the rerun looks it up


def test_a_refused_order_is_a_rejection() -> None:
    fake = FakeAlpaca(CASH, {"AAA": 100.0})
    fake.refuse.add("AAA")
    answer = broker(fake).submit(request())
    assert answer.status == REJECTED
    assert "not tradable" in (answer.reason or "")


def test_final_states_map_to_the_interface() -> None:
    base = order_json(
        MarketOrderRequest(
            symbol="AAA", qty=4, side="buy", time_in_force="day", client_order_id="x"
        ),
        "filled",
        4.0,
        10.0,
    )
    assert to_answer(Order(**base)).status == FILLED
    partial = to_answer(Order(**{**base, "status": "canceled", "filled_qty": "1.5"}))
    assert (partial.status, [f.quantity for f in partial.fills]) == (PARTIAL, [1.5])
    nothing = to_answer(Order(**{**base, "status": "expired", "filled_qty": "0"}))
    assert nothing.status == REJECTED
    assert nothing.fills == ()
    assert to_answer(Order(**{**base, "status": "rejected"})).status == REJECTED
    assert to_answer(Order(**{**base, "status": "new", "filled_qty": "0"})) is None


def test_a_cycle_trades_through_the_adapter_and_reconciles(
    engine: Engine, client: AllocatorClient
) -> None:
    with Session(engine) as session:
        rows = session.execute(select(Price.asset, Price.close).where(Price.date == bar(10)))
        closes = {row.asset: row.close for row in rows}
    fake = FakeAlpaca(CASH, {a: closes[a] * 1.001 for a in ASSETS})
    alpaca = broker(fake)
    rules = SizingRules(cost_bps=0.0)
    with Session(engine) as session, session.begin():
        create_account(session, AccountSpec("desk", list(ASSETS), rules, broker="alpaca"), CASH)
    metrics = TradingMetrics(CollectorRegistry())
    result = run_cycle(engine, alpaca, client, "desk", bar(10), metrics=metrics)
    assert result.outcome == "done"
    assert {o["status"] for o in result.orders} == {FILLED}
    with Session(engine) as session:
        fills = session.scalars(select(Fill)).all()
        assert len(fills) == len(fake.submitted) == len(result.orders)
        assert {f.price for f in fills} == {fake.prices[f.asset] for f in fills}
        account_id = session.scalar(select(BookOrder.account_id))
        assert recorded_holdings(session, account_id) == pytest.approx(alpaca.holdings("desk"))
    again = run_cycle(engine, alpaca, client, "desk", bar(10), metrics=metrics)
    assert again.outcome == "already done"
    assert len(fake.submitted) == len(result.orders)
    fake.prices = {a: p * 1.01 for a, p in fake.prices.items()}
    assert run_cycle(engine, alpaca, client, "desk", bar(11), metrics=metrics).outcome == "done"
