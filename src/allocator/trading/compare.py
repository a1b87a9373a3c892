"""Live against backtest: an account's realized NAV beside ``serving.replay`` of the same model
over the same bars, from the same NAV, at the same cost rate and marked at the same closes, so
what separates them is execution (lots, minimums, band, buffer, per-fill fees, the model answering
a slightly different book). Live NAV at a bar is ``nav_before``: the last cycle's trades are
marked at no close."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from allocator.portfolio import CASH_ID
from allocator.recording.schema import Account, AccountNav, Price, TradeCycle
from allocator.trading import book
from allocator.trading.cycle import DONE
from allocator.trading.errors import TradingError


@dataclass(frozen=True)
class Comparison:
    """The live path beside the backtest's, and what the difference is made of."""

    account: str
    model: str
    start: str
    end: str
    bars: int
    live_nav: float
    backtest_nav: float
    tracking_difference: float
    """Final live NAV over the backtest's, less one."""
    max_abs_difference: float
    """The largest ``|live / backtest - 1|`` over the bars."""
    live_fees: float
    backtest_costs: float
    live_turnover: float
    """Mean traded value over NAV per cycle (sells and buys)."""
    backtest_turnover: float
    mean_cash_gap: float
    """Mean ``|cash weight after trading - the model's cash weight|``: the execution rules' gap."""
    mean_weight_difference: float
    """Mean ``sum |live target - backtest target|``: how far the server's answers drifted."""
    dates: tuple[str, ...]
    live_path: tuple[float, ...]
    backtest_path: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """Live NAV beside the backtest's, with the difference and its parts."""
        return "\n".join(
            [
                f"{self.account} ({self.model}), {self.start} .. {self.end}, {self.bars} bars",
                f"  live NAV      {self.live_nav:,.2f}",
                f"  backtest NAV  {self.backtest_nav:,.2f}",
                f"  tracking difference {self.tracking_difference:+.4%} "
                f"(largest over the span {self.max_abs_difference:.4%})",
                f"  fees {self.live_fees:,.2f} live, {self.backtest_costs:,.2f} backtest; "
                f"turnover per bar {self.live_turnover:.4f} live, "
                f"{self.backtest_turnover:.4f} backtest",
                f"  cash weight off the target by {self.mean_cash_gap:.4%} of NAV on "
                f"average; server answers apart by {self.mean_weight_difference:.4f} "
                "(sum of |weight| differences, mean)",
            ]
        )


def price_table(
    session: Session, assets: list[str], end: dt.date
) -> tuple[np.ndarray, list[dt.date]]:
    """``(dates x assets)`` closes up to ``end`` (NaN where a close is missing), and the dates."""
    rows = session.execute(
        select(Price.date, Price.asset, Price.close).where(
            Price.asset.in_(assets), Price.date <= end
        )
    ).all()
    dates = sorted({r.date for r in rows})
    row_of = {d: i for i, d in enumerate(dates)}
    column = {a: j for j, a in enumerate(assets)}
    table = np.full((len(dates), len(assets)), np.nan)
    for r in rows:
        table[row_of[r.date], column[r.asset]] = float(r.close)
    return table, dates


def done_cycles(
    session: Session, account: Account, start: dt.date | None, end: dt.date | None
) -> list[TradeCycle]:
    """The account's finished cycles from ``start`` to ``end``, in bar order: at least two, all
    answered by one model (a span traded by two models has no single backtest)."""
    query = (
        select(TradeCycle)
        .where(TradeCycle.account_id == account.id, TradeCycle.status == DONE)
        .order_by(TradeCycle.bar_date)
    )
    if start is not None:
        query = query.where(TradeCycle.bar_date >= start)
    if end is not None:
        query = query.where(TradeCycle.bar_date <= end)
    cycles = list(session.scalars(query))
    if len(cycles) < 2:
        raise TradingError(
            f"account {account.name!r} has {len(cycles)} finished cycle(s) in the span; "
            "a comparison needs at least two"
        )
    models = sorted({f"{c.model_name}/{c.model_version}" for c in cycles})
    if len(models) > 1:
        raise TradingError(
            f"account {account.name!r} traded the span with several models ({models}); "
            "compare each model's span on its own (--start/--end)"
        )
    return cycles


def require_every_bar(account_name: str, dates: list[dt.date], cycles: list[TradeCycle]) -> None:
    """Refuse a span with a bar the account did not trade: the backtest trades every bar."""
    first, last = cycles[0].bar_date, cycles[-1].bar_date
    span = [d for d in dates if d >= first]
    traded = [c.bar_date for c in cycles]
    if span != traded:
        missed = sorted(set(span) - set(traded))
        raise TradingError(
            f"account {account_name!r} has no cycle for {len(missed)} bar(s) between "
            f"{first.isoformat()} and {last.isoformat()} (first: "
            f"{missed[0].isoformat() if missed else '-'}); the backtest trades every bar, "
            "so compare a span traded bar by bar"
        )


def execution_gaps(
    decided: list[TradeCycle],
    navs: dict[dt.date, AccountNav],
    targets: list[dict[str, float]],
    outputs: Sequence[Any],
) -> tuple[list[float], list[float], list[float]]:
    """Per decided cycle: traded value over NAV, the cash weight's gap to the target, and the
    L1 distance between the live target and the backtest's smoothed weights."""
    turnover = [navs[c.bar_date].traded_value / c.nav_before for c in decided]
    gap, weight_gap = [], []
    for c, target, output in zip(decided, targets, outputs, strict=False):  # one past decided
        after = navs[c.bar_date]
        gap.append(abs(after.cash / after.nav - target.get(CASH_ID, 0.0)))
        theirs = dict(zip(output.asset_ids, output.smoothed_weights.tolist(), strict=True))
        keys = set(theirs) | set(target)
        weight_gap.append(sum(abs(theirs.get(a, 0.0) - target.get(a, 0.0)) for a in keys))
    return turnover, gap, weight_gap


def compare_account(
    engine: Engine,
    account_name: str,
    registry: Path,
    start: dt.date | None = None,
    end: dt.date | None = None,
) -> Comparison:
    """``account_name``'s done cycles from ``start`` to ``end`` beside their model's replay."""
    # heavy (onnxruntime): loaded only when a comparison runs
    from allocator.serving.replay import replay

    with Session(engine) as session:
        account = book.load_account(session, account_name)
        cycles = done_cycles(session, account, start, end)
        first, last = cycles[0].bar_date, cycles[-1].bar_date
        assets = list(account.assets)
        table, dates = price_table(session, assets, last)
        require_every_bar(account_name, dates, cycles)
        navs = {
            n.bar_date: n
            for n in session.scalars(
                select(AccountNav).where(
                    AccountNav.account_id == account.id, AccountNav.bar_date.between(first, last)
                )
            )
        }
        live = np.array([c.nav_before for c in cycles])
        targets = [dict(zip(c.asset_ids, c.target_weights, strict=True)) for c in cycles]
        cost_bps = account.cost_bps
        name, version = cycles[0].model_name, cycles[0].model_version
    model_dir = registry / name / version
    if not model_dir.is_dir():
        raise TradingError(
            f"model {name}/{version}, which answered the cycles, is not in the registry {registry}"
        )
    result = replay(
        model_dir,
        table,
        assets=assets,
        dates=np.array([d.isoformat() for d in dates], dtype="datetime64[D]"),
        start=np.datetime64(first.isoformat(), "D"),
        end=np.datetime64(last.isoformat(), "D"),
        cost_bps=cost_bps,
        initial_value=float(live[0]),
        portfolio_id=account_name,
    )
    backtest = result.nav
    if backtest.shape != live.shape:
        raise TradingError(
            f"the backtest valued {backtest.size} bars, the account traded {live.size}"
        )
    ratio = live / backtest - 1.0
    decided = cycles[:-1]  # the last cycle's trades are not marked at any close of the span
    turnover, gap, weight_gap = execution_gaps(decided, navs, targets, result.outputs)
    return Comparison(
        account=account_name,
        model=f"{name}/{version}",
        start=first.isoformat(),
        end=last.isoformat(),
        bars=len(cycles),
        live_nav=float(live[-1]),
        backtest_nav=float(backtest[-1]),
        tracking_difference=float(ratio[-1]),
        max_abs_difference=float(np.max(np.abs(ratio))),
        live_fees=float(sum(navs[c.bar_date].fees for c in decided)),
        backtest_costs=float(result.costs.sum()),
        live_turnover=float(np.mean(turnover)),
        backtest_turnover=float(np.mean(result.turnover)),
        mean_cash_gap=float(np.mean(gap)),
        mean_weight_difference=float(np.mean(weight_gap)),
        dates=tuple(c.bar_date.isoformat() for c in cycles),
        live_path=tuple(float(v) for v in live),
        backtest_path=tuple(float(v) for v in backtest),
    )
