"""SIGKILL at random points of the trading cycle, then restart: on SQLite and Postgres.

``allocator trade run`` runs in a child process with ``ALLOCATOR_TRADING_KILL_AT`` naming a point
of the cycle (and which time it is reached); the child dies there without any cleanup, and the
next run starts from whatever it left. After at least 20 kills and a clean final run, every bar
has exactly one finished cycle, the broker received every order once (none doubled, none lost),
each fill is in the book once, the book reconciles with the broker, and the account's NAV equals
that of an account that traded the same bars without a single crash.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from allocator.recording.schema import (
    Account,
    AccountNav,
    Fill,
    Order,
    PaperOrder,
    TradeCycle,
)
from allocator.serving.server import AllocationServer
from allocator.trading.book import AccountSpec, create_account, recorded_holdings
from allocator.trading.faults import KILL_AT_ENV
from allocator.trading.paper import PaperBroker
from allocator.trading.sizing import SizingRules
from tests.trading.conftest import ASSETS, N_BARS, bar

KILLS = 20
FIRST = 5  # the tiny model's window of history is behind bar 5
CASH = 100_000.0
PER_ORDER = {"submitted", "settled"}
POINTS = (
    "reconciled",  # the broker and the book agree, nothing of this bar recorded yet
    "asked",  # the server answered, nothing of this bar recorded yet
    "planned",  # the cycle and its orders are committed, none sent
    "submitted",  # the broker filled an order, the book has not recorded it
    "settled",  # an order's answer and fills are committed
    "finishing",  # the NAV row is added, not committed
    "finished",  # the cycle is committed done
)
"""The ``faults.checkpoint`` points a cycle passes, in order (``PER_ORDER`` once per order)."""


def open_account(engine: Engine, name: str) -> PaperBroker:
    rules = SizingRules(lot_size=1.0, min_order_value=50.0)
    broker = PaperBroker(engine, rules.cost_bps)
    with Session(engine) as session, session.begin():
        create_account(session, AccountSpec(name, list(ASSETS), rules), CASH)
        broker.fund_in(session, name, CASH)
    return broker


def trade_run(engine: Engine, server: AllocationServer, name: str, end: int, kill_at: str | None):
    """``allocator trade run`` up to bar ``end`` in a child process; its return code."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop(KILL_AT_ENV, None)
    if kill_at is not None:
        env[KILL_AT_ENV] = kill_at
    args = [
        *("trade", "run", "--account", name, "--server", f"127.0.0.1:{server.port}"),
        *("--database-url", engine.url.render_as_string(hide_password=False)),
        *("--start", bar(FIRST).isoformat(), "--end", bar(end).isoformat()),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "allocator.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, -signal.SIGKILL), done.stdout + done.stderr
    return done.returncode


def test_sigkill_anywhere_in_a_cycle_then_restart(engine: Engine, server: AllocationServer) -> None:
    rng = random.Random(34)
    broker = open_account(engine, "crashy")
    open_account(engine, "steady")
    kills: dict[str, int] = {}
    end = FIRST
    while sum(kills.values()) < KILLS or end < N_BARS - 1:
        point = rng.choice(POINTS)
        nth = rng.randint(1, 4 if point in PER_ORDER else 2)
        if trade_run(engine, server, "crashy", end, f"{point}:{nth}") == -signal.SIGKILL:
            kills[point] = kills.get(point, 0) + 1
        end = min(end + 1, N_BARS - 1)
    assert sum(kills.values()) >= KILLS
    assert len(kills) >= 5, f"kills spread over too few points: {kills}"
    assert trade_run(engine, server, "crashy", N_BARS - 1, None) == 0
    assert trade_run(engine, server, "steady", N_BARS - 1, None) == 0

    bars = N_BARS - FIRST
    with Session(engine) as session:
        account = session.scalar(select(Account).where(Account.name == "crashy"))
        assert account is not None
        assert not account.halted
        cycles = session.execute(
            select(TradeCycle.bar_date, TradeCycle.status).where(
                TradeCycle.account_id == account.id
            )
        ).all()
        # Every cycle completes, once.
        assert sorted(c.bar_date for c in cycles) == [bar(k) for k in range(FIRST, N_BARS)]
        assert {c.status for c in cycles} == {"done"}
        navs = session.scalar(select(func.count()).where(AccountNav.account_id == account.id))
        assert navs == bars
        orders = session.execute(
            select(Order.id, Order.client_order_id, Order.status).where(
                Order.account_id == account.id
            )
        ).all()
        sent = session.execute(
            select(PaperOrder.client_order_id, PaperOrder.status).where(
                PaperOrder.account == "crashy"
            )
        ).all()
        # The broker saw every recorded order exactly once, and nothing else.
        assert sorted(o.client_order_id for o in orders) == sorted(s.client_order_id for s in sent)
        assert len({s.client_order_id for s in sent}) == len(sent)
        assert {o.status for o in orders} <= {"filled", "partially_filled", "rejected"}
        fills = session.execute(
            select(Fill.order_id, Fill.broker_fill_id).where(Fill.account_id == account.id)
        ).all()
        assert len({f.broker_fill_id for f in fills}) == len(fills)
        filled = [o.id for o in orders if o.status != "rejected"]
        assert sorted(f.order_id for f in fills) == sorted(filled)
        book = recorded_holdings(session, account.id)
        final = session.execute(
            select(Account.name, AccountNav.nav)
            .join(Account, Account.id == AccountNav.account_id)
            .where(AccountNav.bar_date == bar(N_BARS - 1))
        ).all()
    assert book == pytest.approx(broker.holdings("crashy"), rel=1e-12)
    nav = dict(final)
    assert nav["crashy"] == pytest.approx(nav["steady"], rel=1e-9), kills
