"""From target weights to orders: pure functions of NAV, holdings, prices and the rules. The
target is sized on the NAV left after the trade's estimated cost (the environment's rule), so a
fractional account without band, minimum or buffer trades what the backtest trades. A cash buffer
scales risky weights down, a no-trade band skips an asset near its target (an exit always
trades), quantities round down to lots, orders under the minimum value are dropped; sells go
first, never short, and buys fit the cash left, never leveraged."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from allocator.portfolio.costs import cost_rate, trade_cost

BUY = "buy"
SELL = "sell"
LEVERAGE_GUARD = 1e-12  # buys scale a hair under their cash: float rounding never borrows


@dataclass(frozen=True)
class SizingRules:
    """An account's execution rules (``band`` and ``cash_buffer`` are fractions of NAV)."""

    cost_bps: float = 10.0
    lot_size: float = 0.0
    min_order_value: float = 0.0
    band: float = 0.0
    cash_buffer: float = 0.0

    def __post_init__(self) -> None:
        cost_rate(self.cost_bps)
        for name in ("lot_size", "min_order_value"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        for name in ("band", "cash_buffer"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must lie in [0, 1) (a fraction of NAV), got {value}")

    @property
    def rate(self) -> float:
        return cost_rate(self.cost_bps)


@dataclass(frozen=True)
class OrderIntent:
    """One order to send: ``quantity`` > 0 of ``asset`` at the bar's ``price``."""

    asset: str
    side: str
    quantity: float
    price: float

    @property
    def value(self) -> float:
        return self.quantity * self.price


def portfolio_value(
    cash: float, holdings: Mapping[str, float], prices: Mapping[str, float]
) -> float:
    """Cash plus holdings at their prices; refuses negative cash or holdings, unpriced ones."""
    if not (math.isfinite(cash) and cash >= 0):
        raise ValueError(f"cash must be a finite number >= 0, got {cash}")
    for asset, quantity in holdings.items():
        if not (math.isfinite(quantity) and quantity >= 0):
            raise ValueError(f"holding of {asset} must be >= 0 (no shorts), got {quantity}")
        if quantity > 0 and not (asset in prices and prices[asset] > 0):
            raise ValueError(f"no positive price for held asset {asset}")
    return cash + sum(q * prices[a] for a, q in holdings.items() if q > 0)


def current_weights(
    assets: list[str], cash: float, holdings: Mapping[str, float], prices: Mapping[str, float]
) -> list[float]:
    """Weights of cash then ``assets``, as the server takes ``current_weights``; a holding outside
    ``assets`` would count in NAV only, so the caller refuses such a book first."""
    nav = portfolio_value(cash, holdings, prices)
    if nav <= 0:
        raise ValueError(f"the account's NAV is {nav}: nothing to allocate")
    return [cash / nav, *[holdings.get(a, 0.0) * prices[a] / nav for a in assets]]


def round_lot(quantity: float, lot_size: float) -> float:
    """``quantity`` rounded down to a whole number of lots (unchanged when fractional)."""
    if lot_size <= 0:
        return quantity
    return math.floor(quantity / lot_size + 1e-9) * lot_size


def check_target(target: Mapping[str, float], prices: Mapping[str, float]) -> float:
    """The target's risky total; refuses negative, non-finite or unpriced weights, or a sum > 1."""
    for asset, weight in target.items():
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"target weight of {asset} must be >= 0, got {weight}")
        if weight > 0 and not (asset in prices and prices[asset] > 0):
            raise ValueError(f"no positive price for target asset {asset}")
    total = sum(target.values())
    if total > 1 + 1e-9:
        raise ValueError(f"target weights of the assets sum to {total} > 1 (would borrow)")
    return total


def size_orders(
    target: Mapping[str, float],
    cash: float,
    holdings: Mapping[str, float],
    prices: Mapping[str, float],
    rules: SizingRules,
) -> list[OrderIntent]:
    """The orders that move the book towards ``target`` (risky weights; cash is the rest)."""
    nav = portfolio_value(cash, holdings, prices)
    risky = check_target(target, prices)
    if nav <= 0:
        return []
    cap = 1.0 - rules.cash_buffer
    scale = cap / risky if risky > cap else 1.0
    weights = {a: w * scale for a, w in target.items()}
    assets = sorted(set(weights) | {a for a, q in holdings.items() if q > 0})
    held = {a: holdings.get(a, 0.0) for a in assets}
    turnover = sum(abs(weights.get(a, 0.0) - held[a] * prices[a] / nav) for a in assets)
    investable = nav - trade_cost(rules.rate, turnover, nav)
    sells, buys = [], []
    for asset in assets:
        goal = weights.get(asset, 0.0) * investable
        now = held[asset] * prices[asset] if held[asset] else 0.0
        exit_all = goal == 0.0 and held[asset] > 0
        if abs(goal - now) < rules.band * nav and not exit_all:
            continue
        if exit_all:
            sells.append(OrderIntent(asset, SELL, held[asset], prices[asset]))
        elif goal < now:
            quantity = min(held[asset], round_lot((now - goal) / prices[asset], rules.lot_size))
            sells.append(OrderIntent(asset, SELL, quantity, prices[asset]))
        else:
            buys.append(OrderIntent(asset, BUY, (goal - now) / prices[asset], prices[asset]))
    sells = [o for o in sells if o.quantity > 0 and o.value >= rules.min_order_value]
    proceeds = sum(o.value - trade_cost(rules.rate, o.value) for o in sells)
    return sells + fit_buys(buys, cash + proceeds - rules.cash_buffer * nav, rules)


def fit_buys(buys: list[OrderIntent], available: float, rules: SizingRules) -> list[OrderIntent]:
    """Buys rounded to lots, scaled so that they and their costs fit in ``available`` cash."""
    need = sum(o.value + trade_cost(rules.rate, o.value) for o in buys)
    # need == 0 (nothing of value to buy: an empty book, zero-quantity intents) fits as it is.
    factor = (
        1.0 if need <= max(available, 0.0) else max(available, 0.0) / need * (1 - LEVERAGE_GUARD)
    )
    fitted = (
        OrderIntent(o.asset, BUY, round_lot(o.quantity * factor, rules.lot_size), o.price)
        for o in buys
    )
    return [o for o in fitted if o.quantity > 0 and o.value >= rules.min_order_value]
