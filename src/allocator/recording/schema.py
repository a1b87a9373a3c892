"""The SQL trade schema, one layout for Postgres and SQLite; only the migrations build it, and
``alembic check`` compares the migrated database with these models. Per-asset vectors are
parallel JSON arrays on the decision row (JSONB on Postgres), which keeps batch inserts fast; the
migrations' ``decision_weights`` view unnests them for Grafana."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
"""Deterministic constraint names, so migrations (SQLite batch mode) can find them again."""

metadata = MetaData(naming_convention=NAMING_CONVENTION)

VIEWS: tuple[str, ...] = ("decision_weights",)
"""Views the migrations create by hand; autogenerate must not treat them as stray tables."""

JsonType = JSON().with_variant(JSONB(), "postgresql")
"""JSON everywhere, JSONB on Postgres (indexable, what ``jsonb_array_elements_text`` reads)."""

# SQLite only auto-increments an ``INTEGER PRIMARY KEY``; BIGINT there would need explicit ids.
BigIdType = BigInteger().with_variant(Integer(), "sqlite")

Timestamp = DateTime(timezone=True)


def utcnow() -> dt.datetime:
    """Timezone-aware now, the default of time columns."""
    return dt.datetime.now(dt.UTC)


class Base(DeclarativeBase):
    """Declarative base bound to the one naming-convention metadata."""

    metadata = metadata


class ModelVersion(Base):
    """An exported model (registry name + version) with the manifest it was served with."""

    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("name", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    version: Mapped[str] = mapped_column(String(100))
    algorithm: Mapped[str] = mapped_column(String(50))
    manifest: Mapped[dict[str, Any]] = mapped_column(JsonType)
    checksums: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    created: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)


class Decision(Base):
    """One allocation answered by the server (see ``records.DecisionRecord``); arrays are
    parallel to ``asset_ids``, and ``request_id`` makes a retried request record once."""

    __tablename__ = "decisions"
    __table_args__ = (
        Index(None, "portfolio_id", "decided_at"),
        CheckConstraint("latency_seconds >= 0", name="latency_nonnegative"),
        CheckConstraint("turnover >= 0", name="turnover_nonnegative"),
    )

    id: Mapped[int] = mapped_column(BigIdType, primary_key=True)
    request_id: Mapped[str] = mapped_column(String(200), unique=True)
    portfolio_id: Mapped[str] = mapped_column(String(200))
    decided_at: Mapped[dt.datetime] = mapped_column(Timestamp, index=True)
    model_version_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"), index=True)
    asset_ids: Mapped[list[str]] = mapped_column(JsonType)
    raw_weights: Mapped[list[float]] = mapped_column(JsonType)
    smoothed_weights: Mapped[list[float]] = mapped_column(JsonType)
    current_weights: Mapped[list[float] | None] = mapped_column(JsonType, nullable=True)
    turnover: Mapped[float] = mapped_column(Float)
    icm_reward: Mapped[float | None] = mapped_column(Float, nullable=True)
    latency_seconds: Mapped[float] = mapped_column(Float)
    slots: Mapped[list[str] | None] = mapped_column(JsonType, nullable=True)
    request_fingerprint: Mapped[str | None] = mapped_column(String(64), nullable=True)
    market_date: Mapped[dt.date | None] = mapped_column(Date, nullable=True)
    """The bar the decision was made for; stamped by the trading cycle that asked for it."""
    prices_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """SHA-256 of the closes the decision saw (``trading.ids.prices_digest``)."""


class TrainingRun(Base):
    """One training run: its config, where its files are and its final metrics."""

    __tablename__ = "training_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    algorithm: Mapped[str] = mapped_column(String(50))
    run_dir: Mapped[str] = mapped_column(String(1000))
    config: Mapped[dict[str, Any]] = mapped_column(JsonType)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JsonType, nullable=True)
    started: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    finished: Mapped[dt.datetime | None] = mapped_column(Timestamp, nullable=True)


class WalkForwardRun(Base):
    """A walk-forward validation: its config and, once finished, the summary over windows."""

    __tablename__ = "walk_forward_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    config: Mapped[dict[str, Any]] = mapped_column(JsonType)
    started: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    finished: Mapped[dt.datetime | None] = mapped_column(Timestamp, nullable=True)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JsonType, nullable=True)


class WalkForwardWindow(Base):
    """One train/test window of a walk-forward run with the agent's and baselines' metrics."""

    __tablename__ = "walk_forward_windows"
    __table_args__ = (
        UniqueConstraint("run_id", "index"),
        CheckConstraint("train_start <= train_end", name="train_ordered"),
        CheckConstraint("test_start <= test_end", name="test_ordered"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("walk_forward_runs.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    train_start: Mapped[dt.date] = mapped_column(Date)
    train_end: Mapped[dt.date] = mapped_column(Date)
    test_start: Mapped[dt.date] = mapped_column(Date)
    test_end: Mapped[dt.date] = mapped_column(Date)
    model_version_id: Mapped[int | None] = mapped_column(
        ForeignKey("model_versions.id", ondelete="SET NULL"), nullable=True
    )
    metrics: Mapped[dict[str, Any]] = mapped_column(JsonType)
    baseline_metrics: Mapped[dict[str, Any]] = mapped_column(JsonType)
    icm_stats: Mapped[dict[str, Any] | None] = mapped_column(JsonType, nullable=True)


class Promotion(Base):
    """The promotion gate's decision on a candidate, promoted or not, with the gates' reasons
    and both models' held-out metrics: "why is this version serving?" is answered here alone.
    Versions are plain strings: a rejected candidate never reaches ``model_versions``."""

    __tablename__ = "promotions"
    __table_args__ = (
        Index(None, "model_name", "decided_at"),
        CheckConstraint("train_start <= train_end", name="train_ordered"),
        CheckConstraint("holdout_start <= holdout_end", name="holdout_ordered"),
        CheckConstraint("train_end < holdout_start", name="holdout_after_train"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_name: Mapped[str] = mapped_column(String(200))
    candidate_version: Mapped[str] = mapped_column(String(100))
    production_version: Mapped[str | None] = mapped_column(String(100), nullable=True)
    decided_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    promoted: Mapped[bool] = mapped_column(Boolean)
    reasons: Mapped[list[dict[str, Any]]] = mapped_column(JsonType)
    candidate_metrics: Mapped[dict[str, Any]] = mapped_column(JsonType)
    production_metrics: Mapped[dict[str, Any] | None] = mapped_column(JsonType, nullable=True)
    train_start: Mapped[dt.date] = mapped_column(Date)
    train_end: Mapped[dt.date] = mapped_column(Date)
    holdout_start: Mapped[dt.date] = mapped_column(Date)
    holdout_end: Mapped[dt.date] = mapped_column(Date)
    details: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)


class Price(Base):
    """One daily close of one asset, as ingested; ingesting again updates it in place, and
    ``source`` and ``ingested_at`` trace where and when the current value came from."""

    __tablename__ = "prices"
    __table_args__ = (
        UniqueConstraint("asset", "date"),
        Index(None, "date"),
        CheckConstraint("close > 0", name="close_positive"),
    )

    id: Mapped[int] = mapped_column(BigIdType, primary_key=True)
    asset: Mapped[str] = mapped_column(String(200))
    date: Mapped[dt.date] = mapped_column(Date)
    close: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(1000))
    ingested_at: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)


class Account(Base):
    """A trading account: universe, model, sizing rules, and ``halted``, set by a failed
    reconciliation until an operator clears it (a wrong book must not trade)."""

    __tablename__ = "accounts"
    __table_args__ = (
        CheckConstraint("cost_bps >= 0", name="cost_nonnegative"),
        CheckConstraint("lot_size >= 0", name="lot_nonnegative"),
        CheckConstraint("min_order_value >= 0", name="min_order_nonnegative"),
        CheckConstraint("band >= 0 AND band < 1", name="band_fraction"),
        CheckConstraint("cash_buffer >= 0 AND cash_buffer < 1", name="buffer_fraction"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    broker: Mapped[str] = mapped_column(String(50))
    model: Mapped[str | None] = mapped_column(String(200), nullable=True)
    assets: Mapped[list[str]] = mapped_column(JsonType)
    cost_bps: Mapped[float] = mapped_column(Float)
    lot_size: Mapped[float] = mapped_column(Float)
    min_order_value: Mapped[float] = mapped_column(Float)
    band: Mapped[float] = mapped_column(Float)
    cash_buffer: Mapped[float] = mapped_column(Float)
    halted: Mapped[bool] = mapped_column(Boolean, default=False)
    halt_reason: Mapped[str | None] = mapped_column(String(2000), nullable=True)
    created: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)


class TradeCycle(Base):
    """One account's cycle for one bar, written with its orders before anything is sent and
    ``done`` once all are settled, so a restart finishes it. ``request_id`` joins ``decisions``
    (not a foreign key: the server may record into another database)."""

    __tablename__ = "trade_cycles"
    __table_args__ = (UniqueConstraint("account_id", "bar_date"),)

    id: Mapped[int] = mapped_column(BigIdType, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    bar_date: Mapped[dt.date] = mapped_column(Date)
    request_id: Mapped[str] = mapped_column(String(200), unique=True)
    status: Mapped[str] = mapped_column(String(20))
    model_name: Mapped[str] = mapped_column(String(200))
    model_version: Mapped[str] = mapped_column(String(100))
    asset_ids: Mapped[list[str]] = mapped_column(JsonType)
    current_weights: Mapped[list[float]] = mapped_column(JsonType)
    target_weights: Mapped[list[float]] = mapped_column(JsonType)
    closes: Mapped[dict[str, float]] = mapped_column(JsonType)
    prices_digest: Mapped[str] = mapped_column(String(64))
    nav_before: Mapped[float] = mapped_column(Float)
    started: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)
    finished: Mapped[dt.datetime | None] = mapped_column(Timestamp, nullable=True)


class Order(Base):
    """An order the cycle decided on; ``client_order_id`` is what the broker deduplicates on."""

    __tablename__ = "orders"
    __table_args__ = (
        CheckConstraint("quantity > 0", name="quantity_positive"),
        CheckConstraint("side IN ('buy', 'sell')", name="side_known"),
    )

    id: Mapped[int] = mapped_column(BigIdType, primary_key=True)
    cycle_id: Mapped[int] = mapped_column(ForeignKey("trade_cycles.id"), index=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    client_order_id: Mapped[str] = mapped_column(String(64), unique=True)
    asset: Mapped[str] = mapped_column(String(200))
    side: Mapped[str] = mapped_column(String(4))
    quantity: Mapped[float] = mapped_column(Float)
    reference_price: Mapped[float] = mapped_column(Float)
    sequence: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(20))
    reason: Mapped[str | None] = mapped_column(String(2000), nullable=True)


class Fill(Base):
    """One execution of an order; ``realized_pnl`` (average cost, net of its fee): P&L per fill."""

    __tablename__ = "fills"
    __table_args__ = (
        CheckConstraint("quantity > 0", name="quantity_positive"),
        CheckConstraint("price > 0", name="price_positive"),
        CheckConstraint("fee >= 0", name="fee_nonnegative"),
    )

    id: Mapped[int] = mapped_column(BigIdType, primary_key=True)
    order_id: Mapped[int] = mapped_column(ForeignKey("orders.id"), index=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    broker_fill_id: Mapped[str] = mapped_column(String(100), unique=True)
    asset: Mapped[str] = mapped_column(String(200))
    side: Mapped[str] = mapped_column(String(4))
    quantity: Mapped[float] = mapped_column(Float)
    price: Mapped[float] = mapped_column(Float)
    fee: Mapped[float] = mapped_column(Float)
    realized_pnl: Mapped[float] = mapped_column(Float)
    bar_date: Mapped[dt.date] = mapped_column(Date)


class Position(Base):
    """The recorded holding of one asset (``CASH`` holds the cash), from the fills."""

    __tablename__ = "positions"
    __table_args__ = (UniqueConstraint("account_id", "asset"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    asset: Mapped[str] = mapped_column(String(200))
    quantity: Mapped[float] = mapped_column(Float)
    cost_basis: Mapped[float] = mapped_column(Float)
    realized_pnl: Mapped[float] = mapped_column(Float)


class AccountNav(Base):
    """An account's NAV at one bar's close, after that bar's trades."""

    __tablename__ = "account_nav"
    __table_args__ = (UniqueConstraint("account_id", "bar_date"),)

    id: Mapped[int] = mapped_column(BigIdType, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    bar_date: Mapped[dt.date] = mapped_column(Date)
    nav: Mapped[float] = mapped_column(Float)
    cash: Mapped[float] = mapped_column(Float)
    fees: Mapped[float] = mapped_column(Float)
    traded_value: Mapped[float] = mapped_column(Float)


class PaperOrder(Base):
    """The paper broker's own order book, keyed by client order id (its deduplication)."""

    __tablename__ = "paper_orders"

    id: Mapped[int] = mapped_column(BigIdType, primary_key=True)
    client_order_id: Mapped[str] = mapped_column(String(64), unique=True)
    account: Mapped[str] = mapped_column(String(200), index=True)
    asset: Mapped[str] = mapped_column(String(200))
    side: Mapped[str] = mapped_column(String(4))
    quantity: Mapped[float] = mapped_column(Float)
    filled_quantity: Mapped[float] = mapped_column(Float)
    price: Mapped[float | None] = mapped_column(Float, nullable=True)
    fee: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(20))
    reason: Mapped[str | None] = mapped_column(String(2000), nullable=True)
    created: Mapped[dt.datetime] = mapped_column(Timestamp, default=utcnow)


class PaperHolding(Base):
    """The paper broker's holdings (``CASH`` included): what a real broker's API would report."""

    __tablename__ = "paper_holdings"
    __table_args__ = (UniqueConstraint("account", "asset"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account: Mapped[str] = mapped_column(String(200))
    asset: Mapped[str] = mapped_column(String(200))
    quantity: Mapped[float] = mapped_column(Float)
