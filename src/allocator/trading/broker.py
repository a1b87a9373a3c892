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

    @property
    def filled_quantity(self) -> float:
        return sum(f.quantity for f in self.fills)


class Broker(Protocol):
    """What the trading cycle needs from a broker."""

    name: str

    def submit(self, order: OrderRequest) -> BrokerOrder:
        """Send ``order``; a second call with the same client order id changes nothing."""
        ...

    def lookup(self, account: str, client_order_id: str) -> BrokerOrder | None:
        """The order with that client id, or None when the broker never received it."""
        ...

    def holdings(self, account: str) -> dict[str, float]:
        """Quantity per asset, cash under ``CASH_ID``; zero holdings may be left out."""
        ...
