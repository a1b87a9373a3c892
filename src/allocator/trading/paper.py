"""The paper broker: fills market orders at the bar's close under the environment's costs. Its
books live in the trade database apart from the account's, so reconciliation compares two
independent records as with a real broker; it refuses what a cash account refuses (overselling,
overspending). Slippage, partial fills and rejections exist for tests and rehearsals."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from allocator.portfolio import CASH_ID
from allocator.portfolio.costs import cost_rate, trade_cost
from allocator.recording.schema import PaperHolding, PaperOrder
from allocator.trading.broker import (
    FILLED,
    PARTIAL,
    REJECTED,
    BrokerFill,
    BrokerOrder,
    OrderRequest,
)
from allocator.trading.sizing import BUY, SELL

FLOAT_SLACK = 1e-9
"""Relative slack on the cash and holding checks: the sizer's float sums may land an ulp over."""


class PaperBroker:
    """A simulated cash account per account name, persisted in the trade database."""

    def __init__(
        self,
        engine: Engine,
        cost_bps: float,
        *,
        slippage_bps: float = 0.0,
        fill_ratio: float = 1.0,
        reject_assets: Iterable[str] = (),
    ) -> None:
        if not 0.0 < fill_ratio <= 1.0:
            raise ValueError(f"fill_ratio must lie in (0, 1], got {fill_ratio}")
        if slippage_bps < 0:
            raise ValueError(f"slippage_bps must be >= 0, got {slippage_bps}")
        self.engine = engine
        self.rate = cost_rate(cost_bps)
        self.slippage = slippage_bps / 1e4
        self.fill_ratio = fill_ratio
        self.reject_assets = frozenset(reject_assets)

    def fund_in(self, session: Session, account: str, cash: float) -> None:
        """Deposit ``cash`` in the caller's transaction: a new account is funded as it is made."""
        if not cash > 0:
            raise ValueError(f"a deposit must be > 0, got {cash}")
        self._holding(session, account, CASH_ID).quantity += cash

    def holdings(self, account: str) -> dict[str, float]:
        with Session(self.engine) as session:
            rows = session.scalars(select(PaperHolding).where(PaperHolding.account == account))
            return {h.asset: h.quantity for h in rows if h.quantity != 0}

    def lookup(self, account: str, client_order_id: str) -> BrokerOrder | None:
        with Session(self.engine) as session:
            row = session.scalar(
                select(PaperOrder).where(PaperOrder.client_order_id == client_order_id)
            )
            return None if row is None or row.account != account else answer(row)

    def submit(self, order: OrderRequest) -> BrokerOrder:
        """Fill ``order`` once; a known client order id returns its first answer."""
        known = self.lookup(order.account, order.client_order_id)
        if known is not None:
            return known
        try:
            with Session(self.engine) as session, session.begin():
                row = self._execute(session, order)
                session.add(row)
                session.flush()
                return answer(row)
        except IntegrityError:
            # Another submit of the same id won the race: its answer is the answer.
            known = self.lookup(order.account, order.client_order_id)
            if known is None:
                raise
            return known

    def _execute(self, session: Session, order: OrderRequest) -> PaperOrder:
        row = PaperOrder(
            client_order_id=order.client_order_id,
            account=order.account,
            asset=order.asset,
            side=order.side,
            quantity=order.quantity,
            filled_quantity=0.0,
            fee=0.0,
            status=REJECTED,
        )
        cash = self._holding(session, order.account, CASH_ID)
        held = self._holding(session, order.account, order.asset)
        quantity = order.quantity * self.fill_ratio
        sign = 1.0 if order.side == BUY else -1.0
        price = order.price * (1.0 + sign * self.slippage)
        value = quantity * price
        fee = trade_cost(self.rate, value)
        if order.side not in (BUY, SELL) or not (order.quantity > 0 and order.price > 0):
            row.reason = f"invalid order: {order.side} {order.quantity} at {order.price}"
        elif order.asset in self.reject_assets:
            row.reason = f"{order.asset} is not tradable at this broker"
        elif order.side == SELL and quantity > held.quantity * (1 + FLOAT_SLACK):
            row.reason = f"sell of {quantity:g} {order.asset} exceeds the {held.quantity:g} held"
        elif order.side == BUY and value + fee > cash.quantity * (1 + FLOAT_SLACK):
            row.reason = (
                f"buy of {value + fee:.2f} (with fees) exceeds the cash {cash.quantity:.2f}"
            )
        if row.reason is not None:
            return row
        quantity = min(quantity, held.quantity) if order.side == SELL else quantity
        held.quantity += sign * quantity
        cash.quantity = max(cash.quantity - sign * quantity * price - fee, 0.0)
        row.filled_quantity, row.price, row.fee = quantity, price, fee
        row.status = FILLED if self.fill_ratio == 1.0 else PARTIAL
        return row

    def _holding(self, session: Session, account: str, asset: str) -> PaperHolding:
        """The holding row, locked for this transaction (``FOR UPDATE`` on Postgres)."""
        query = select(PaperHolding).where(
            PaperHolding.account == account, PaperHolding.asset == asset
        )
        holding = session.scalar(query.with_for_update())
        if holding is None:
            holding = PaperHolding(account=account, asset=asset, quantity=0.0)
            session.add(holding)
        return holding


def answer(row: PaperOrder) -> BrokerOrder:
    """The broker's answer for a stored order: one fill when anything was filled."""
    fills: tuple[BrokerFill, ...] = ()
    if row.filled_quantity > 0 and row.price is not None:
        fills = (BrokerFill(f"{row.client_order_id}-1", row.filled_quantity, row.price, row.fee),)
    return BrokerOrder(row.client_order_id, row.status, fills, row.reason)
