"""The account's recorded book: accounts, positions (cash under ``CASH_ID``), fills and halts.

Positions change only through fills, each recorded once (unique broker id); P&L is average-cost,
and a fee is a loss when paid."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from allocator.portfolio import CASH_ID, check_id, is_cash_id
from allocator.recording.schema import Account, Fill, Order, Position, TradeCycle
from allocator.trading.broker import BrokerFill
from allocator.trading.errors import AccountHaltedError, TradingError, UnknownAccountError
from allocator.trading.sizing import BUY, SizingRules

BROKERS = ("paper", "alpaca")  # the CLI builds the one an account names


@dataclass(frozen=True)
class AccountSpec:
    """What ``trade account create`` asks for, checked when made."""

    name: str
    assets: Sequence[str]
    rules: SizingRules
    model: str | None = None
    broker: str = "paper"

    def __post_init__(self) -> None:
        check_id(self.name, "account")
        if not self.assets:
            raise ValueError("an account needs at least one asset")
        for asset in self.assets:
            check_id(asset, "asset")
            if is_cash_id(asset):
                raise ValueError(f"{asset!r} names the cash slot; list only risky assets")
        if len(set(self.assets)) != len(self.assets):
            raise ValueError(f"assets must be distinct, got {list(self.assets)}")
        if self.broker not in BROKERS:
            raise ValueError(f"unknown broker {self.broker!r}; known: {', '.join(BROKERS)}")


def create_account(session: Session, spec: AccountSpec, cash: float) -> Account:
    """Insert the account with ``cash`` recorded; refuses a name already taken."""
    if not (math.isfinite(cash) and cash > 0):
        raise ValueError(f"initial cash must be > 0, got {cash}")
    account = Account(
        name=spec.name,
        broker=spec.broker,
        model=spec.model,
        assets=list(spec.assets),
        halted=False,
        **asdict(spec.rules),  # the rules are columns of the account, name for name
    )
    session.add(account)
    try:
        session.flush()  # the name is unique: a taken one fails here
    except IntegrityError:
        raise TradingError(f"account {spec.name!r} already exists") from None
    opening = position(session, account.id, CASH_ID)
    opening.quantity = opening.cost_basis = cash
    return account


def load_account(session: Session, name: str, *, trading: bool = False) -> Account:
    """The account named ``name``; with ``trading``, refuses a halted one."""
    account = session.scalar(select(Account).where(Account.name == name))
    if account is None:
        known = session.scalars(select(Account.name).order_by(Account.name)).all()
        listed = (
            ", ".join(known) if known else "none; create one with `allocator trade account create`"
        )
        raise UnknownAccountError(f"unknown account {name!r} (accounts: {listed})")
    if trading and account.halted:
        raise AccountHaltedError(
            f"account {name!r} is halted: {account.halt_reason}. Inspect it with "
            "`allocator trade status`, fix the book, then `allocator trade account resume`"
        )
    return account


def account_rules(account: Account) -> SizingRules:
    return SizingRules(**{f.name: getattr(account, f.name) for f in fields(SizingRules)})


def recorded_holdings(session: Session, account_id: int) -> dict[str, float]:
    """Quantity per asset (cash under ``CASH_ID``), zero positions left out."""
    rows = session.scalars(select(Position).where(Position.account_id == account_id))
    return {p.asset: p.quantity for p in rows if p.quantity != 0}


def position(session: Session, account_id: int, asset: str) -> Position:
    """The position row, created empty when missing, locked for this transaction."""
    query = select(Position).where(Position.account_id == account_id, Position.asset == asset)
    row = session.scalar(query.with_for_update())
    if row is None:
        row = Position(
            account_id=account_id, asset=asset, quantity=0.0, cost_basis=0.0, realized_pnl=0.0
        )
        session.add(row)
    return row


def apply_fill(session: Session, order: Order, fill: BrokerFill, bar_date: dt.date) -> None:
    """Record ``fill`` of ``order`` and move the positions, unless it was recorded before."""
    if session.scalar(select(Fill.id).where(Fill.broker_fill_id == fill.fill_id)) is not None:
        return
    held = position(session, order.account_id, order.asset)
    cash = position(session, order.account_id, CASH_ID)
    value = fill.quantity * fill.price
    if order.side == BUY:
        realized = -fill.fee
        held.quantity += fill.quantity
        held.cost_basis += value
        cash.quantity -= value + fill.fee
    else:
        average = held.cost_basis / held.quantity if held.quantity > 0 else fill.price
        sold = min(fill.quantity, held.quantity)
        realized = value - sold * average - fill.fee
        held.cost_basis = 0.0 if sold >= held.quantity else held.cost_basis - sold * average
        held.quantity = max(held.quantity - fill.quantity, 0.0)
        cash.quantity += value - fill.fee
    cash.cost_basis = cash.quantity
    held.realized_pnl += realized
    session.add(
        Fill(
            order_id=order.id,
            account_id=order.account_id,
            broker_fill_id=fill.fill_id,
            asset=order.asset,
            side=order.side,
            quantity=fill.quantity,
            price=fill.price,
            fee=fill.fee,
            realized_pnl=realized,
            bar_date=bar_date,
        )
    )


def set_halt(account: Account, reason: str | None) -> None:
    """Halt the account with ``reason``, or resume it with None."""
    account.halted = reason is not None
    account.halt_reason = reason


def last_traded(session: Session, name: str) -> dt.date | None:
    """The latest bar the account has a cycle for (None before its first)."""
    return session.scalar(
        select(TradeCycle.bar_date)
        .join(Account, Account.id == TradeCycle.account_id)
        .where(Account.name == name)
        .order_by(TradeCycle.bar_date.desc())
        .limit(1)
    )
