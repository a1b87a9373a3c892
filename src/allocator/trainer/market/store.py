"""Prices in the trade database: the idempotent upsert behind ``allocator data ingest`` and the
read behind ``dataset: database``. Both go through ``data``'s checks: one set of rules."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from allocator.recording.schema import Price, utcnow
from allocator.recording.settings import shown_url

PRICES = Price.metadata.tables[Price.__tablename__]


class PriceStoreError(RuntimeError):
    """The price table cannot be read or written; the message says what to do."""


@contextmanager
def price_engine(url: str) -> Iterator[Engine]:
    """An engine on ``url`` that holds no connection once the block ends."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        yield engine
    finally:
        engine.dispose()


def require_table(conn: Connection, url: str) -> None:
    """Refuse a database the migrations have not built the ``prices`` table in."""
    if not sa.inspect(conn).has_table(PRICES.name):
        raise PriceStoreError(
            f"{shown_url(url)} has no prices table: run `allocator db upgrade` on it first"
        )


@dataclass(frozen=True)
class UpsertCounts:
    """What an upsert did: rows new to the table, rows whose close changed, rows already equal."""

    added: int
    changed: int
    unchanged: int


def upsert_prices(conn: Connection, rows: pd.DataFrame, source: str) -> UpsertCounts:
    """Upsert ``rows`` (``date``, ``asset``, ``close``) in the caller's transaction; an unchanged
    close is not written (its ``source`` keeps the first file)."""
    if rows.empty:
        return UpsertCounts(0, 0, 0)
    frame = rows[["date", "asset", "close"]].copy()
    frame["date"] = pd.to_datetime(frame["date"]).dt.date
    stored = stored_closes(conn, frame)
    keys = list(zip(frame["asset"], frame["date"], strict=True))
    closes = frame["close"].astype(float).tolist()
    now = utcnow()
    payload = [  # new or changed rows only
        {"asset": a, "date": d, "close": c, "source": source, "ingested_at": now}
        for (a, d), c in zip(keys, closes, strict=True)
        if stored.get((a, d)) != c
    ]
    if payload:
        conn.execute(upsert_statement(conn), payload)
    added = sum(k not in stored for k in keys)
    return UpsertCounts(added, len(payload) - added, len(keys) - len(payload))


def upsert_statement(conn: Connection) -> Any:
    """``INSERT .. ON CONFLICT (asset, date) DO UPDATE``: safe against a concurrent ingest."""
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    if conn.dialect.name not in ("postgresql", "sqlite"):
        raise PriceStoreError(f"prices: unsupported database {conn.dialect.name!r}")
    stmt = insert(PRICES)
    return stmt.on_conflict_do_update(
        index_elements=["asset", "date"],
        set_={c: stmt.excluded[c] for c in ("close", "source", "ingested_at")},
    )


def stored_closes(conn: Connection, frame: pd.DataFrame) -> dict[tuple[str, dt.date], float]:
    """The stored closes of ``frame``'s assets over its date range, by (asset, date)."""
    assets = sorted(set(frame["asset"]))
    query = sa.select(PRICES.c.asset, PRICES.c.date, PRICES.c.close).where(
        PRICES.c.date.between(min(frame["date"]), max(frame["date"]))
    )
    found: dict[tuple[str, dt.date], float] = {}
    for start in range(0, len(assets), 500):  # bounded IN lists, whatever the universe size
        chunk = query.where(PRICES.c.asset.in_(assets[start : start + 500]))
        for asset, date, close in conn.execute(chunk):
            found[(asset, date)] = float(close)
    return found


def read_price_frame(url: str, as_of: dt.date) -> pd.DataFrame:
    """Every stored close dated on or before ``as_of``, as a long frame (date, asset, close)."""
    try:
        with price_engine(url) as engine, engine.connect() as conn:
            require_table(conn, url)
            query = (
                sa.select(PRICES.c.date, PRICES.c.asset, PRICES.c.close)
                .where(PRICES.c.date <= as_of)
                .order_by(PRICES.c.date, PRICES.c.asset)
            )
            rows = conn.execute(query).all()
    except SQLAlchemyError as exc:
        raise PriceStoreError(f"{shown_url(url)}: cannot read prices ({exc})") from exc
    frame = pd.DataFrame(rows, columns=["date", "asset", "close"])
    frame["date"] = pd.to_datetime(frame["date"])
    return frame
