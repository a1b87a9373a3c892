"""One account's trading cycle for one bar, run exactly once however often it is started: finish
any cycle a crash left (the broker deduplicates its recorded orders); reconcile, halting the
account on a mismatch (fail closed); return a cycle already done as it was; else read the bar, ask
the server, record the cycle and its orders before submitting any (sells first), record each
answer with its fills, then the NAV and ``done``."""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from sqlalchemy import Engine, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from allocator.metrics.trading import TradingMetrics, trading_metrics
from allocator.portfolio import CASH_ID
from allocator.recording.schema import (
    Account,
    AccountNav,
    Decision,
    Fill,
    Order,
    TradeCycle,
    utcnow,
)
from allocator.serving.client import AllocatorClient, AllocatorError
from allocator.trading import book
from allocator.trading.bars import read_bar
from allocator.trading.broker import REJECTED, Broker, OrderRequest
from allocator.trading.errors import (
    BrokerRejectedError,
    ReconciliationError,
    ServerUnavailableError,
    TradingError,
)
from allocator.trading.faults import checkpoint
from allocator.trading.ids import client_order_id, prices_digest, request_id
from allocator.trading.sizing import current_weights, size_orders

T = TypeVar("T")

SUBMITTING = "submitting"
DONE = "done"
RETRY_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"})
"""Answers that mean the server did not decide: asking again with the same id is safe."""


@dataclass(frozen=True)
class Retries:
    """How long a cycle keeps asking a server that does not answer."""

    attempts: int = 3
    backoff_seconds: float = 0.5
    sleep: Callable[[float], None] = time.sleep


@dataclass
class CycleResult:
    """What a cycle did (or had done, for a rerun)."""

    account: str
    bar_date: dt.date
    outcome: str
    nav_before: float
    nav_after: float
    model: str
    orders: list[dict[str, object]] = field(default_factory=list)

    @property
    def rejected(self) -> list[dict[str, object]]:
        return [o for o in self.orders if o["status"] == REJECTED]


def with_retries(client: AllocatorClient, retries: Retries, call: Callable[[], T]) -> T:
    """``call()``, asked again (with backoff) while the server answers "not now"."""
    last = ""
    for attempt in range(retries.attempts):
        try:
            return call()
        except AllocatorError as error:
            if error.code.name not in RETRY_CODES:
                raise TradingError(f"the allocation server refused the request: {error}") from None
            last = f"{error.code.name}: {error.details}"
        if attempt + 1 < retries.attempts:
            retries.sleep(retries.backoff_seconds * 2**attempt)
    raise ServerUnavailableError(
        f"the allocation server at {client.target} did not answer after {retries.attempts} "
        f"attempts ({last}); nothing was recorded, rerun the cycle when it is back"
    )


def model_window(client: AllocatorClient, account: Account, retries: Retries) -> int:
    """The window of the model the account asks (its own, else the server's default)."""
    models = with_retries(client, retries, client.list_models)
    chosen = [
        m for m in models if m.name == account.model or (account.model is None and m.is_default)
    ]
    if not chosen:
        served = ", ".join(f"{m.name}/{m.version}" for m in models) or "none"
        raise TradingError(
            f"the allocation server has no model {account.model or '(default)'}; it serves {served}"
        )
    return chosen[-1].window


def run_cycle(
    engine: Engine,
    broker: Broker,
    client: AllocatorClient,
    account_name: str,
    bar_date: dt.date,
    *,
    retries: Retries = Retries(),
    metrics: TradingMetrics | None = None,
) -> CycleResult:
    """Run ``account_name``'s cycle for ``bar_date`` once (see the module docstring)."""
    metrics = metrics or trading_metrics()
    try:
        with Session(engine) as session:
            account = book.load_account(session, account_name, trading=True)
            unfinished = session.scalars(
                select(TradeCycle.id)
                .where(TradeCycle.account_id == account.id, TradeCycle.status != DONE)
                .order_by(TradeCycle.bar_date)
            ).all()
        for cycle_id in unfinished:
            execute(engine, broker, cycle_id, metrics)
        reconcile(engine, broker, account_name, metrics)
        checkpoint("reconciled")
        with Session(engine) as session:
            account = book.load_account(session, account_name, trading=True)
            done = session.scalar(
                select(TradeCycle).where(
                    TradeCycle.account_id == account.id, TradeCycle.bar_date == bar_date
                )
            )
            if done is not None:
                stamp_decision(session, done)
                session.commit()
                metrics.cycles.labels(account_name, "already_done").inc()
                return describe(session, done, "already done")
            later = book.last_traded(session, account_name)
            if later is not None and later > bar_date:
                raise TradingError(
                    f"account {account_name!r} already traded {later.isoformat()}, after "
                    f"{bar_date.isoformat()}: cycles run forward in time"
                )
            window = model_window(client, account, retries)
            closes = read_bar(session, account.assets, bar_date, window + 1)
            holdings = book.recorded_holdings(session, account.id)
            cycle = plan(session, client, account, bar_date, closes, holdings, retries)
            try:
                session.commit()
            except IntegrityError:
                raise TradingError(
                    f"another run recorded {account_name!r}'s cycle for {bar_date.isoformat()} "
                    "first; rerun to see it"
                ) from None
            cycle_id = cycle.id
        checkpoint("planned")
        execute(engine, broker, cycle_id, metrics)
        with Session(engine) as session:
            result = describe(session, session.get_one(TradeCycle, cycle_id), "done")
    except TradingError:
        metrics.cycles.labels(account_name, "failed").inc()
        raise
    metrics.cycles.labels(account_name, "done").inc()  # its rejections are counted with its orders
    if result.rejected:
        reasons = "; ".join(f"{o['side']} {o['asset']}: {o['reason']}" for o in result.rejected)
        raise BrokerRejectedError(
            f"the broker rejected {len(result.rejected)} order(s) of {account_name!r}'s cycle "
            f"for {bar_date.isoformat()} (recorded as rejected; the cycle is complete): {reasons}"
        )
    return result


def plan(
    session: Session,
    client: AllocatorClient,
    account: Account,
    bar_date: dt.date,
    closes: dict[str, list[float]],
    holdings: dict[str, float],
    retries: Retries,
) -> TradeCycle:
    """Ask the server and add the cycle with its orders to ``session`` (not yet committed)."""
    prices = {a: w[-1] for a, w in closes.items()}
    cash = holdings.pop(CASH_ID, 0.0)
    strays = sorted(set(holdings) - set(account.assets))
    if strays:
        raise TradingError(f"account {account.name!r} holds {strays}, outside its assets")
    nav = book_value(cash, holdings, prices)
    weights = current_weights(list(account.assets), cash, holdings, prices)
    rid = request_id(account.name, bar_date)
    allocation = with_retries(
        client,
        retries,
        lambda: client.allocate(
            account.name,
            list(account.assets),
            [closes[a] for a in account.assets],
            current_weights=weights,
            request_id=rid,
            model=account.model,
        ),
    )
    checkpoint("asked")
    target = dict(
        zip(allocation.asset_ids[1:], allocation.smoothed_weights[1:].tolist(), strict=True)
    )
    intents = size_orders(target, cash, holdings, prices, book.account_rules(account))
    cycle = TradeCycle(
        account_id=account.id,
        bar_date=bar_date,
        request_id=rid,
        status=SUBMITTING,
        model_name=allocation.model_name,
        model_version=allocation.model_version,
        asset_ids=list(allocation.asset_ids),
        current_weights=weights,
        target_weights=allocation.smoothed_weights.tolist(),
        closes=prices,
        prices_digest=prices_digest(bar_date, closes),
        nav_before=nav,
    )
    session.add(cycle)
    session.flush()
    for sequence, intent in enumerate(intents):
        session.add(
            Order(
                cycle_id=cycle.id,
                account_id=account.id,
                client_order_id=client_order_id(account.name, bar_date, intent.asset, intent.side),
                asset=intent.asset,
                side=intent.side,
                quantity=intent.quantity,
                reference_price=intent.price,
                sequence=sequence,
                status="new",
            )
        )
    return cycle


def book_value(cash: float, holdings: dict[str, float], prices: dict[str, float]) -> float:
    """NAV at ``prices``; a held asset without a price cannot be valued."""
    missing = sorted(a for a, q in holdings.items() if q and a not in prices)
    if missing:
        raise TradingError(f"no price for held assets {missing}")
    return cash + sum(q * prices[a] for a, q in holdings.items())


def execute(engine: Engine, broker: Broker, cycle_id: int, metrics: TradingMetrics) -> None:
    """Send the cycle's unsent orders in sequence, record each answer, then finish the cycle."""
    with Session(engine) as session:
        cycle = session.get_one(TradeCycle, cycle_id)
        name, bar_date = session.get_one(Account, cycle.account_id).name, cycle.bar_date
        pending = session.scalars(
            select(Order.id)
            .where(Order.cycle_id == cycle_id, Order.status == "new")
            .order_by(Order.sequence)
        ).all()
    for order_id in pending:
        with Session(engine) as session, session.begin():
            order = session.get_one(Order, order_id)
            request = OrderRequest(
                order.client_order_id,
                name,
                order.asset,
                order.side,
                order.quantity,
                order.reference_price,
            )
            answer = broker.submit(request)
            checkpoint("submitted")
            for fill in answer.fills:
                book.apply_fill(session, order, fill, bar_date)
            order.status, order.reason = answer.status, answer.reason
        checkpoint("settled")
        metrics.orders.labels(name, answer.status).inc()
    finish(engine, cycle_id)
    checkpoint("finished")


def finish(engine: Engine, cycle_id: int) -> None:
    """The NAV at the bar after its trades, the decision's market date, and ``done``."""
    with Session(engine) as session, session.begin():
        cycle = session.get_one(TradeCycle, cycle_id)
        if cycle.status == DONE:
            return
        holdings = book.recorded_holdings(session, cycle.account_id)
        cash = holdings.pop(CASH_ID, 0.0)
        fills = session.execute(
            select(Fill.quantity, Fill.price, Fill.fee)
            .join(Order, Fill.order_id == Order.id)
            .where(Order.cycle_id == cycle_id)
        ).all()
        session.add(
            AccountNav(
                account_id=cycle.account_id,
                bar_date=cycle.bar_date,
                nav=book_value(cash, holdings, cycle.closes),
                cash=cash,
                fees=sum(f.fee for f in fills),
                traded_value=sum(f.quantity * f.price for f in fills),
            )
        )
        cycle.status, cycle.finished = DONE, utcnow()
        stamp_decision(session, cycle)
        checkpoint("finishing")


def stamp_decision(session: Session, cycle: TradeCycle) -> None:
    """Give the server's decision row (when it records into this database and has written it)
    the bar it was made for and the digest of the closes it saw; a rerun stamps a late row."""
    session.execute(
        update(Decision)
        .where(Decision.request_id == cycle.request_id, Decision.market_date.is_(None))
        .values(market_date=cycle.bar_date, prices_digest=cycle.prices_digest)
    )


def reconcile(engine: Engine, broker: Broker, account_name: str, metrics: TradingMetrics) -> None:
    """Halt the account (persisted, counted) when the broker's holdings differ from the book."""
    with Session(engine) as session, session.begin():
        account = book.load_account(session, account_name, trading=True)
        recorded = book.recorded_holdings(session, account.id)
        held = broker.holdings(account_name)
        differences = [
            f"{asset}: broker {held.get(asset, 0.0):.10g}, book {recorded.get(asset, 0.0):.10g}"
            for asset in sorted(set(recorded) | set(held))
            if not math.isclose(
                held.get(asset, 0.0), recorded.get(asset, 0.0), rel_tol=1e-9, abs_tol=1e-6
            )
        ]
        metrics.halted.labels(account_name).set(0)
        if not differences:
            return
        book.set_halt(account, "reconciliation mismatch: " + "; ".join(differences))
    metrics.mismatches.labels(account_name).inc()
    metrics.halted.labels(account_name).set(1)
    raise ReconciliationError(
        f"account {account_name!r} halted, its broker and book disagree ({'; '.join(differences)})"
    )


def describe(session: Session, cycle: TradeCycle, outcome: str) -> CycleResult:
    account = session.get_one(Account, cycle.account_id)
    nav = session.scalar(
        select(AccountNav.nav).where(
            AccountNav.account_id == cycle.account_id, AccountNav.bar_date == cycle.bar_date
        )
    )
    orders = session.scalars(
        select(Order).where(Order.cycle_id == cycle.id).order_by(Order.sequence)
    ).all()
    filled = dict(
        session.execute(
            select(Fill.order_id, Fill.quantity).where(Fill.order_id.in_([o.id for o in orders]))
        ).all()
    )
    return CycleResult(
        account=account.name,
        bar_date=cycle.bar_date,
        outcome=outcome,
        nav_before=cycle.nav_before,
        nav_after=float(nav) if nav is not None else math.nan,
        model=f"{cycle.model_name}/{cycle.model_version}",
        orders=[
            {
                "asset": o.asset,
                "side": o.side,
                "quantity": o.quantity,
                "filled": filled.get(o.id, 0.0),
                "status": o.status,
                "reason": o.reason,
                "client_order_id": o.client_order_id,
            }
            for o in orders
        ],
    )
