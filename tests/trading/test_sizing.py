"""Order sizing: never short, never leveraged, lots, band, minimum order value, cash buffer."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from allocator.portfolio.costs import cost_rate, trade_cost
from allocator.trading.sizing import BUY, SELL, SizingRules, portfolio_value, size_orders

ASSETS = ["A", "B", "C"]
price = st.floats(1.0, 500.0)
quantity = st.floats(0.0, 1_000.0)


@st.composite
def books(draw: st.DrawFn) -> tuple[dict[str, float], float, dict[str, float], dict[str, float]]:
    """A target (risky weights summing to at most 1), cash, holdings and prices."""
    prices = {a: draw(price) for a in ASSETS}
    holdings = {a: draw(quantity) for a in ASSETS}
    cash = draw(st.floats(0.0, 100_000.0))
    raw = [draw(st.floats(0.0, 1.0)) for _ in ASSETS]
    total = sum(raw) + draw(st.floats(0.0, 1.0))
    target = {a: (w / total if total > 0 else 0.0) for a, w in zip(ASSETS, raw, strict=True)}
    return target, cash, holdings, prices


rules_strategy = st.builds(
    SizingRules,
    cost_bps=st.floats(0.0, 100.0),
    lot_size=st.sampled_from([0.0, 1.0, 10.0, 0.5]),
    min_order_value=st.sampled_from([0.0, 50.0, 1_000.0]),
    band=st.sampled_from([0.0, 0.01, 0.05]),
    cash_buffer=st.sampled_from([0.0, 0.0025, 0.05]),
)


def execute(orders, cash, holdings, rules):  # type: ignore[no-untyped-def]
    """Apply orders in sequence at their prices, with the cost model's fees."""
    held = dict(holdings)
    lowest = cash
    for o in orders:
        fee = trade_cost(cost_rate(rules.cost_bps), o.value)
        if o.side == SELL:
            held[o.asset] -= o.quantity
            cash += o.value - fee
        else:
            held[o.asset] = held.get(o.asset, 0.0) + o.quantity
            cash -= o.value + fee
        lowest = min(lowest, cash)
    return cash, held, lowest


@given(books(), rules_strategy)
def test_never_short_never_leveraged_sells_first(book, rules) -> None:  # type: ignore[no-untyped-def]
    target, cash, holdings, prices = book
    orders = size_orders(target, cash, holdings, prices, rules)
    sides = [o.side for o in orders]
    assert sides == sorted(sides, key=lambda s: s != SELL), "sells come before buys"
    end_cash, held, lowest = execute(orders, cash, holdings, rules)
    nav = portfolio_value(cash, holdings, prices)
    assert lowest >= -1e-9 * max(nav, 1.0), "cash never goes negative: no borrowing"
    assert all(q >= -1e-9 for q in held.values()), "no short position"
    for o in orders:
        assert o.quantity > 0
        assert o.value >= rules.min_order_value
        exits_all = o.side == SELL and math.isclose(o.quantity, holdings[o.asset])
        if rules.lot_size > 0 and not exits_all:
            lots = o.quantity / rules.lot_size
            assert abs(lots - round(lots)) < 1e-6, f"{o} is not a whole number of lots"
    if any(o.side == BUY for o in orders):
        assert end_cash >= rules.cash_buffer * nav - 1e-6 * nav, "a buy never eats the buffer"


@given(books())
def test_fractional_without_frictions_reaches_the_target(book) -> None:  # type: ignore[no-untyped-def]
    """No lots, band, minimum or buffer: the book ends at the target, NAV net of its costs."""
    target, cash, holdings, prices = book
    rules = SizingRules(cost_bps=10.0)
    nav = portfolio_value(cash, holdings, prices)
    assume(nav > 1.0)
    orders = size_orders(target, cash, holdings, prices, rules)
    end_cash, held, _ = execute(orders, cash, holdings, rules)
    end_nav = end_cash + sum(q * prices[a] for a, q in held.items())
    for a in ASSETS:
        assert held[a] * prices[a] / end_nav == pytest.approx(target[a], abs=2e-3)
    assert end_nav <= nav + 1e-6


def test_band_leaves_small_moves_alone() -> None:
    prices = {"A": 100.0, "B": 50.0}
    holdings = {"A": 50.0, "B": 100.0}  # 5,000 each, NAV 10,000 with no cash
    target = {"A": 0.52, "B": 0.48}
    assert size_orders(target, 0.0, holdings, prices, SizingRules(cost_bps=0, band=0.05)) == []
    moved = size_orders(target, 0.0, holdings, prices, SizingRules(cost_bps=0, band=0.01))
    assert [(o.side, o.asset) for o in moved] == [("sell", "B"), ("buy", "A")]


def test_an_exit_sells_the_whole_odd_lot_holding() -> None:
    orders = size_orders(
        {"A": 0.0}, 0.0, {"A": 13.7}, {"A": 10.0}, SizingRules(lot_size=10.0, band=0.5)
    )
    assert [(o.side, o.quantity) for o in orders] == [("sell", 13.7)]


def test_lots_round_down_and_min_order_value_drops() -> None:
    rules = SizingRules(cost_bps=0, lot_size=10.0, min_order_value=500.0)
    orders = size_orders({"A": 0.5, "B": 0.004}, 10_000.0, {}, {"A": 33.0, "B": 1.0}, rules)
    assert [(o.asset, o.quantity) for o in orders] == [("A", 150.0)]


def test_cash_buffer_keeps_cash_out_of_a_full_target() -> None:
    rules = SizingRules(cost_bps=0, cash_buffer=0.05)
    orders = size_orders({"A": 1.0}, 1_000.0, {}, {"A": 10.0}, rules)
    assert [(o.side, o.quantity) for o in orders] == [("buy", pytest.approx(95.0))]


@pytest.mark.parametrize(
    ("target", "holdings", "message"),
    [
        ({"A": 0.7, "B": 0.7}, {}, "sum to 1.4"),
        ({"A": -0.1}, {}, "must be >= 0"),
        ({"Z": 0.1}, {}, "no positive price for target asset Z"),
        ({"A": 0.1}, {"A": -1.0}, "no shorts"),
        ({"A": 0.1}, {"Z": 1.0}, "no positive price for held asset Z"),
    ],
)
def test_bad_input_is_named(target, holdings, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        size_orders(target, 100.0, holdings, {"A": 1.0, "B": 2.0}, SizingRules())


@pytest.mark.parametrize(
    ("field", "value"),
    [("band", 1.0), ("cash_buffer", -0.1), ("lot_size", -1.0), ("cost_bps", 5e3)],
)
def test_rules_refuse_out_of_range(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SizingRules(**{field: value})
