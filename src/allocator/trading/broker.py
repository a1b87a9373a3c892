"""The one small interface every broker sits behind, and what it answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

FILLED = "filled"
PARTIAL = "partially_filled"
REJECTED = "rejected"


@dataclass(frozen=True)
class OrderRequest:
    """A market order for the bar; ``price`` is the bar's close the order was sized at."""

    client_order_id: str
    account: str
    asset: str
    side: str
    quantity: float
    price: float


@dataclass(frozen=True)
class BrokerFill:
    """One execution; ``fill_id`` is unique at the broker (the book records each once)."""

    fill_id: str
    quantity: float
    price: float
    fee: float


@dataclass(frozen=True)
class BrokerOrder:
    """The broker's state of one order: final for a market order at the bar."""

    client_order_id: str
    status: str
    fills: tuple[BrokerFill, ...] = ()
    reason: str | None = None


class Broker(Protocol):
    """What the trading cycle needs from a broker."""

    def submit(self, order: OrderRequest) -> BrokerOrder:
        """Send ``order``; a second call with the same client order id changes nothing."""
        ...

    def holdings(self, account: str) -> dict[str, float]:
        """Quantity per asset, cash under ``CASH_ID``; zero holdings may be left out."""
        ...
