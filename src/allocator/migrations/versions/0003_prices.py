"""Prices: the daily closes ``allocator data ingest`` stores and ``dataset: database`` reads."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"

# Frozen copies of the schema's types: a migration must not change when the models do.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create ``prices``, unique on (asset, date), with a date index for ``as_of`` reads."""
    op.create_table(
        "prices",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("asset", sa.String(length=200), nullable=False),
        sa.Column("date", sa.Date(), nullable=False),
        sa.Column("close", sa.Float(), nullable=False),
        sa.Column("source", sa.String(length=1000), nullable=False),
        sa.Column("ingested_at", TIMESTAMP, nullable=False),
        sa.CheckConstraint("close > 0", name=op.f("ck_prices_close_positive")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_prices")),
        sa.UniqueConstraint("asset", "date", name=op.f("uq_prices_asset_date")),
    )
    op.create_index(op.f("ix_prices_date"), "prices", ["date"])


def downgrade() -> None:
    """Drop the index, then the table (nothing refers to it)."""
    op.drop_index(op.f("ix_prices_date"), table_name="prices")
    op.drop_table("prices")
