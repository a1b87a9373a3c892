"""The paper broker: fills at the bar's price under the environment's cost model, once per id."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from allocator.portfolio import CASH_ID
from allocator.portfolio.costs import cost_rate, trade_cost
from allocator.trading.broker import FILLED, PARTIAL, REJECTED, OrderRequest
from allocator.trading.paper import PaperBroker


def order(cid: str, side: str, quantity: float, price: float = 50.0) -> OrderRequest:
    return OrderRequest(cid, "acct", "AAA", side, quantity, price)


def funded(engine: Engine, cash: float, *args: Any, **options: Any) -> PaperBroker:
    """A paper broker with ``cash`` deposited into account ``acct``."""
    broker = PaperBroker(engine, *args, **options)
    with Session(engine) as session, session.begin():
        broker.fund_in(session, "acct", cash)
    return broker


def test_fill_price_and_fee_are_the_environments(engine: Engine) -> None:
    broker = funded(engine, 10_000.0, cost_bps=10.0)
    answer = broker.submit(order("b1", "buy", 100.0))
    assert answer.status == FILLED
    (fill,) = answer.fills
    assert (fill.quantity, fill.price) == (100.0, 50.0)
    assert fill.fee == trade_cost(cost_rate(10.0), 5_000.0) == pytest.approx(5.0)
    assert broker.holdings("acct") == {CASH_ID: pytest.approx(4_995.0), "AAA": 100.0}


def test_a_resubmitted_order_fills_once_and_a_restart_keeps_the_books(engine: Engine) -> None:
    broker = funded(engine, 10_000.0, cost_bps=10.0)
    first = broker.submit(order("b1", "buy", 100.0))
    restarted = PaperBroker(engine, cost_bps=10.0)
    assert restarted.submit(order("b1", "buy", 100.0)) == first
    assert restarted.lookup("acct", "b1") == first
    assert restarted.lookup("acct", "never-sent") is None
    assert restarted.holdings("acct")["AAA"] == 100.0


def test_slippage_partial_fills_and_rejections(engine: Engine) -> None:
    broker = funded(
        engine, 10_000.0, 0.0, slippage_bps=100.0, fill_ratio=0.5, reject_assets=["BBB"]
    )
    bought = broker.submit(order("b1", "buy", 10.0, 100.0))
    assert bought.status == PARTIAL
    assert (bought.fills[0].quantity, bought.fills[0].price) == (5.0, pytest.approx(101.0))
    sold = broker.submit(order("s1", "sell", 2.0, 100.0))
    assert sold.fills[0].price == pytest.approx(99.0)
    refused = broker.submit(OrderRequest("x", "acct", "BBB", "buy", 1.0, 10.0))
    assert refused.status == REJECTED
    assert "BBB is not tradable" in (refused.reason or "")


def test_a_cash_account_refuses_shorts_and_overdrafts(engine: Engine) -> None:
    broker = funded(engine, 1_000.0, cost_bps=10.0)
    over = broker.submit(order("b1", "buy", 20.0))  # 1,000 plus a 1.00 fee
    assert over.status == REJECTED
    assert "exceeds the cash" in (over.reason or "")
    short = broker.submit(order("s1", "sell", 1.0))
    assert short.status == REJECTED
    assert "exceeds the 0 held" in (short.reason or "")
    assert broker.holdings("acct") == {CASH_ID: 1_000.0}
