"""Alpaca behind the broker interface, through ``alpaca-py`` (the ``alpaca`` extra), on the account
the credentials name. A known client order id is looked up, never sent again, then polled until
final; an order still open when the wait ends stays ``new`` in the book for the next run. Fills
are recorded at Alpaca's average price (the market's, not the bar's close) with no fee (no
commission on equities)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from allocator.portfolio import CASH_ID
from allocator.trading.broker import (
    FILLED,
    PARTIAL,
    REJECTED,
    BrokerFill,
    BrokerOrder,
    OrderRequest,
)
from allocator.trading.errors import TradingError
from allocator.trading.sizing import BUY

KEY_ENV = "ALPACA_API_KEY"
SECRET_ENV = "ALPACA_SECRET_KEY"
QTY_DECIMALS = 9  # Alpaca's precision; a fractional order is rounded down to it
CLOSED = frozenset({"canceled", "expired", "done_for_day", "replaced", "stopped", "suspended"})
"""Final states besides filled and rejected: whatever was filled is what the order did."""


class BrokerPendingError(TradingError):
    """An order is still open at the broker; the next run looks it up by its client order id."""


def import_sdk() -> Any:
    """The SDK's modules, or a clear error naming the extra to install."""
    try:
        from alpaca.common.exceptions import APIError
        from alpaca.trading.client import TradingClient
        from alpaca.trading.enums import OrderSide, TimeInForce
        from alpaca.trading.requests import MarketOrderRequest
    except ImportError as exc:
        raise TradingError(
            "the Alpaca broker needs alpaca-py: pip install 'allocator[alpaca]'"
        ) from exc

    class SDK:
        api_error = APIError
        client = TradingClient
        side = OrderSide
        tif = TimeInForce
        market = MarketOrderRequest

    return SDK


def to_answer(order: Any) -> BrokerOrder | None:
    """The broker interface's answer for an Alpaca ``Order``; None while it is still open."""
    status = str(getattr(order.status, "value", order.status))
    filled = float(order.filled_qty or 0.0)
    price = float(order.filled_avg_price) if order.filled_avg_price else None
    fills: tuple[BrokerFill, ...] = ()
    if filled > 0 and price is not None:
        fills = (BrokerFill(str(order.id), filled, price, 0.0),)
    cid = str(order.client_order_id)
    if status == "filled":
        return BrokerOrder(cid, FILLED, fills)
    if status == "rejected":
        return BrokerOrder(cid, REJECTED, (), "rejected by Alpaca")
    if status in CLOSED:
        if fills:
            return BrokerOrder(cid, PARTIAL, fills, f"{status} after a partial fill")
        return BrokerOrder(cid, REJECTED, (), f"{status} at Alpaca with nothing filled")
    return None


class AlpacaBroker:
    """One Alpaca account (its paper endpoint) as a ``Broker``."""

    def __init__(
        self,
        client: Any,
        *,
        wait_seconds: float = 60.0,
        poll_seconds: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        sdk: Any = None,
    ) -> None:
        self.sdk = sdk or import_sdk()
        self.client = client
        self.wait_seconds = wait_seconds
        self.poll_seconds = poll_seconds
        self.sleep = sleep

    @classmethod
    def from_env(cls) -> AlpacaBroker:
        """A client on the credentials in ``ALPACA_API_KEY`` and ``ALPACA_SECRET_KEY``."""
        sdk = import_sdk()
        key, secret = os.environ.get(KEY_ENV), os.environ.get(SECRET_ENV)
        if not key or not secret:
            raise TradingError(f"the Alpaca broker needs {KEY_ENV} and {SECRET_ENV} set")
        return cls(sdk.client(key, secret, paper=True), sdk=sdk)

    def _order(self, client_order_id: str) -> Any | None:
        try:
            return self.client.get_order_by_client_id(client_order_id)
        except self.sdk.api_error as exc:
            if exc.status_code == 404:
                return None
            raise TradingError(f"Alpaca refused the order lookup: {exc}") from exc

    def submit(self, order: OrderRequest) -> BrokerOrder:
        """Send ``order`` unless Alpaca knows its client order id, then wait until it is final."""
        if self._order(order.client_order_id) is None:
            scale = 10**QTY_DECIMALS
            request = self.sdk.market(
                symbol=order.asset,
                qty=int(order.quantity * scale) / scale,
                side=self.sdk.side.BUY if order.side == BUY else self.sdk.side.SELL,
                time_in_force=self.sdk.tif.DAY,
                client_order_id=order.client_order_id,
            )
            try:
                self.client.submit_order(request)
            except self.sdk.api_error as exc:
                if self._order(order.client_order_id) is None:  # not a duplicate: refused
                    return BrokerOrder(order.client_order_id, REJECTED, (), str(exc))
        return self.wait(order.client_order_id)

    def wait(self, client_order_id: str) -> BrokerOrder:
        """Poll the order until it is final, at most ``wait_seconds``."""
        deadline = time.monotonic() + self.wait_seconds
        while True:
            found = self._order(client_order_id)
            answer = to_answer(found) if found is not None else None
            if answer is not None:
                return answer
            if time.monotonic() >= deadline:
                raise BrokerPendingError(
                    f"Alpaca order {client_order_id} is still open after {self.wait_seconds:g} "
                    "s; rerun the cycle once it has filled (it is looked up, not sent again)"
                )
            self.sleep(self.poll_seconds)

    def holdings(self, account: str) -> dict[str, float]:
        held = {p.symbol: float(p.qty) for p in self.client.get_all_positions()}
        held[CASH_ID] = float(self.client.get_account().cash or 0.0)
        return {asset: quantity for asset, quantity in held.items() if quantity != 0}


def opening_cash(given: float | None) -> float:
    """The cash of the Alpaca account the credentials name; refuses one that holds positions
    (the book starts from cash only) or whose cash differs from ``given``."""
    held = AlpacaBroker.from_env().holdings("")
    cash = held.pop(CASH_ID, 0.0)
    if held:
        raise TradingError(
            f"the Alpaca account holds {sorted(held)}: start from an account holding only cash"
        )
    if given is not None and abs(given - cash) > 0.005:
        raise TradingError(
            f"--cash {given:,.2f} differs from the Alpaca account's cash {cash:,.2f}"
        )
    return cash
