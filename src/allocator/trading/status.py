"""What ``allocator trade status`` reports per account; unrealized P&L is valued at the last
cycle's closes, so nothing but the trade database is needed."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from allocator.portfolio import CASH_ID
from allocator.recording.schema import Account, AccountNav, Fill, Order, Position, TradeCycle
from allocator.trading.broker import REJECTED


def account_status(engine: Engine, name: str | None = None) -> list[dict[str, Any]]:
    """One entry per account (or only ``name``), sorted by name."""
    with Session(engine) as session:
        query = select(Account).order_by(Account.name)
        if name is not None:
            query = query.where(Account.name == name)
        return [one_account(session, account) for account in session.scalars(query)]


def one_account(session: Session, account: Account) -> dict[str, Any]:
    last = session.scalar(
        select(TradeCycle)
        .where(TradeCycle.account_id == account.id)
        .order_by(TradeCycle.bar_date.desc())
        .limit(1)
    )
    nav = session.scalar(
        select(AccountNav)
        .where(AccountNav.account_id == account.id)
        .order_by(AccountNav.bar_date.desc())
        .limit(1)
    )
    peak = session.scalar(
        select(func.max(AccountNav.nav)).where(AccountNav.account_id == account.id)
    )
    closes: dict[str, float] = last.closes if last is not None else {}
    positions, cash = [], 0.0
    for p in session.scalars(
        select(Position).where(Position.account_id == account.id).order_by(Position.asset)
    ):
        if p.asset == CASH_ID:
            cash = p.quantity
            continue
        price = closes.get(p.asset)
        value = p.quantity * price if price is not None else None
        positions.append(
            {
                "asset": p.asset,
                "quantity": p.quantity,
                "cost_basis": p.cost_basis,
                "realized_pnl": p.realized_pnl,
                "value": value,
                "unrealized_pnl": None if value is None else value - p.cost_basis,
            }
        )
    fees = session.scalar(select(func.sum(Fill.fee)).where(Fill.account_id == account.id))
    rejected = session.scalars(
        select(func.count(Order.id)).where(Order.account_id == account.id, Order.status == REJECTED)
    ).one()
    return {
        "account": account.name,
        "broker": account.broker,
        "model": account.model,
        "halted": account.halted,
        "halt_reason": account.halt_reason,
        "last_bar": last.bar_date.isoformat() if last is not None else None,
        "last_cycle_status": last.status if last is not None else None,
        "nav": nav.nav if nav is not None else None,
        "drawdown": 1.0 - nav.nav / peak if nav is not None and peak else None,
        "turnover": (
            nav.traded_value / last.nav_before
            if nav is not None and last is not None and last.nav_before > 0
            else None
        ),
        "cash": cash,
        "fees": float(fees or 0.0),
        "rejected_orders": int(rejected),
        "positions": positions,
    }
