"""The live book: accounts, trade cycles, orders, fills, positions, NAV per bar, paper books.

Decisions gain the market date they were made for and a digest of the closes they saw.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"

# Frozen copies of the schema's types: a migration must not change when the models do.
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TIMESTAMP = sa.DateTime(timezone=True)

TABLES = (
    "fills",
    "orders",
    "trade_cycles",
    "positions",
    "account_nav",
    "paper_orders",
    "paper_holdings",
    "accounts",
)
"""Dependents first: the order ``downgrade`` drops them in."""


def upgrade() -> None:
    """Create the trading tables; two nullable columns on ``decisions`` (a plain ADD COLUMN,
    so the ``decision_weights`` view that reads the table is left alone)."""
    # long: one create_table per table of the live book, spelled out as alembic wants them
    op.create_table(
        "accounts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("broker", sa.String(length=50), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=True),
        sa.Column("assets", JSON, nullable=False),
        sa.Column("cost_bps", sa.Float(), nullable=False),
        sa.Column("lot_size", sa.Float(), nullable=False),
        sa.Column("min_order_value", sa.Float(), nullable=False),
        sa.Column("band", sa.Float(), nullable=False),
        sa.Column("cash_buffer", sa.Float(), nullable=False),
        sa.Column("halted", sa.Boolean(), nullable=False),
        sa.Column("halt_reason", sa.String(length=2000), nullable=True),
        sa.Column("created", TIMESTAMP, nullable=False),
        sa.CheckConstraint("band >= 0 AND band < 1", name=op.f("ck_accounts_band_fraction")),
        sa.CheckConstraint(
            "cash_buffer >= 0 AND cash_buffer < 1", name=op.f("ck_accounts_buffer_fraction")
        ),
        sa.CheckConstraint("cost_bps >= 0", name=op.f("ck_accounts_cost_nonnegative")),
        sa.CheckConstraint("lot_size >= 0", name=op.f("ck_accounts_lot_nonnegative")),
        sa.CheckConstraint("min_order_value >= 0", name=op.f("ck_accounts_min_order_nonnegative")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_accounts")),
        sa.UniqueConstraint("name", name=op.f("uq_accounts_name")),
    )
    op.create_table(
        "paper_holdings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account", sa.String(length=200), nullable=False),
        sa.Column("asset", sa.String(length=200), nullable=False),
        sa.Column("quantity", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_paper_holdings")),
        sa.UniqueConstraint("account", "asset", name=op.f("uq_paper_holdings_account_asset")),
    )
    op.create_table(
        "paper_orders",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("client_order_id", sa.String(length=64), nullable=False),
        sa.Column("account", sa.String(length=200), nullable=False),
        sa.Column("asset", sa.String(length=200), nullable=False),
        sa.Column("side", sa.String(length=4), nullable=False),
        sa.Column("quantity", sa.Float(), nullable=False),
        sa.Column("filled_quantity", sa.Float(), nullable=False),
        sa.Column("price", sa.Float(), nullable=True),
        sa.Column("fee", sa.Float(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("reason", sa.String(length=2000), nullable=True),
        sa.Column("created", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_paper_orders")),
        sa.UniqueConstraint("client_order_id", name=op.f("uq_paper_orders_client_order_id")),
    )
    op.create_index(op.f("ix_paper_orders_account"), "paper_orders", ["account"])
    op.create_table(
        "account_nav",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("bar_date", sa.Date(), nullable=False),
        sa.Column("nav", sa.Float(), nullable=False),
        sa.Column("cash", sa.Float(), nullable=False),
        sa.Column("fees", sa.Float(), nullable=False),
        sa.Column("traded_value", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_account_nav_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_account_nav")),
        sa.UniqueConstraint(
            "account_id", "bar_date", name=op.f("uq_account_nav_account_id_bar_date")
        ),
    )
    op.create_table(
        "positions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("asset", sa.String(length=200), nullable=False),
        sa.Column("quantity", sa.Float(), nullable=False),
        sa.Column("cost_basis", sa.Float(), nullable=False),
        sa.Column("realized_pnl", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_positions_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_positions")),
        sa.UniqueConstraint("account_id", "asset", name=op.f("uq_positions_account_id_asset")),
    )
    op.create_table(
        "trade_cycles",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("bar_date", sa.Date(), nullable=False),
        sa.Column("request_id", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("model_name", sa.String(length=200), nullable=False),
        sa.Column("model_version", sa.String(length=100), nullable=False),
        sa.Column("asset_ids", JSON, nullable=False),
        sa.Column("current_weights", JSON, nullable=False),
        sa.Column("target_weights", JSON, nullable=False),
        sa.Column("closes", JSON, nullable=False),
        sa.Column("prices_digest", sa.String(length=64), nullable=False),
        sa.Column("nav_before", sa.Float(), nullable=False),
        sa.Column("started", TIMESTAMP, nullable=False),
        sa.Column("finished", TIMESTAMP, nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_trade_cycles_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trade_cycles")),
        sa.UniqueConstraint(
            "account_id", "bar_date", name=op.f("uq_trade_cycles_account_id_bar_date")
        ),
        sa.UniqueConstraint("request_id", name=op.f("uq_trade_cycles_request_id")),
    )
    op.create_table(
        "orders",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("cycle_id", BIG_ID, nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("client_order_id", sa.String(length=64), nullable=False),
        sa.Column("asset", sa.String(length=200), nullable=False),
        sa.Column("side", sa.String(length=4), nullable=False),
        sa.Column("quantity", sa.Float(), nullable=False),
        sa.Column("reference_price", sa.Float(), nullable=False),
        sa.Column("sequence", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("reason", sa.String(length=2000), nullable=True),
        sa.CheckConstraint("side IN ('buy', 'sell')", name=op.f("ck_orders_side_known")),
        sa.CheckConstraint("quantity > 0", name=op.f("ck_orders_quantity_positive")),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_orders_account_id_accounts")
        ),
        sa.ForeignKeyConstraint(
            ["cycle_id"], ["trade_cycles.id"], name=op.f("fk_orders_cycle_id_trade_cycles")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_orders")),
        sa.UniqueConstraint("client_order_id", name=op.f("uq_orders_client_order_id")),
    )
    op.create_index(op.f("ix_orders_cycle_id"), "orders", ["cycle_id"])
    op.create_table(
        "fills",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("order_id", BIG_ID, nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("broker_fill_id", sa.String(length=100), nullable=False),
        sa.Column("asset", sa.String(length=200), nullable=False),
        sa.Column("side", sa.String(length=4), nullable=False),
        sa.Column("quantity", sa.Float(), nullable=False),
        sa.Column("price", sa.Float(), nullable=False),
        sa.Column("fee", sa.Float(), nullable=False),
        sa.Column("realized_pnl", sa.Float(), nullable=False),
        sa.Column("bar_date", sa.Date(), nullable=False),
        sa.CheckConstraint("fee >= 0", name=op.f("ck_fills_fee_nonnegative")),
        sa.CheckConstraint("price > 0", name=op.f("ck_fills_price_positive")),
        sa.CheckConstraint("quantity > 0", name=op.f("ck_fills_quantity_positive")),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_fills_account_id_accounts")
        ),
        sa.ForeignKeyConstraint(["order_id"], ["orders.id"], name=op.f("fk_fills_order_id_orders")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fills")),
        sa.UniqueConstraint("broker_fill_id", name=op.f("uq_fills_broker_fill_id")),
    )
    op.create_index(op.f("ix_fills_order_id"), "fills", ["order_id"])
    op.add_column("decisions", sa.Column("market_date", sa.Date(), nullable=True))
    op.add_column("decisions", sa.Column("prices_digest", sa.String(length=64), nullable=True))


def downgrade() -> None:
    """Drop the decision columns (plain ALTER TABLE, as 0004) and the tables, dependents first;
    dropping a table drops its indexes."""
    op.drop_column("decisions", "prices_digest")
    op.drop_column("decisions", "market_date")
    for table in TABLES:
        op.drop_table(table)
