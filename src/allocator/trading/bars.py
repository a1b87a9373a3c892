"""The bar a cycle trades on, from the ``prices`` table: every asset of the account priced on
the date, with enough history, or a refusal naming the asset before anything is recorded."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from allocator.recording.schema import Price
from allocator.trading.errors import MissingPriceError, StaleBarError


def bar_dates(session: Session, start: dt.date | None, end: dt.date | None) -> list[dt.date]:
    """Every date with at least one close in ``[start, end]``, in order."""
    query = select(Price.date).distinct().order_by(Price.date)
    if start is not None:
        query = query.where(Price.date >= start)
    if end is not None:
        query = query.where(Price.date <= end)
    return list(session.scalars(query))


def read_bar(
    session: Session, assets: Sequence[str], bar_date: dt.date, closes: int
) -> dict[str, list[float]]:
    """``closes`` closes per asset ending on ``bar_date``, oldest first."""
    if session.scalar(select(func.count()).where(Price.date == bar_date)) == 0:
        latest = session.scalar(select(func.max(Price.date)))
        raise StaleBarError(
            f"no prices for {bar_date.isoformat()} in the prices table (latest bar: "
            f"{latest.isoformat() if latest else 'none'}); ingest the bar with "
            "`allocator data ingest` before trading it"
        )
    windows: dict[str, list[float]] = {}
    for asset in assets:
        rows = session.execute(
            select(Price.date, Price.close)
            .where(Price.asset == asset, Price.date <= bar_date)
            .order_by(Price.date.desc())
            .limit(closes)
        ).all()
        if not rows or rows[0].date != bar_date:
            raise MissingPriceError(
                f"no close for {asset} on {bar_date.isoformat()} (its latest: "
                f"{rows[0].date.isoformat() if rows else 'none'}); the cycle needs every "
                "asset of the account priced on its bar"
            )
        if len(rows) < closes:
            raise MissingPriceError(
                f"{asset} has {len(rows)} closes up to {bar_date.isoformat()}, the model "
                f"needs {closes} (its window plus one)"
            )
        windows[asset] = [float(r.close) for r in reversed(rows)]
    return windows
