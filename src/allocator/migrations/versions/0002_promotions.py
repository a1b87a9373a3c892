"""Promotions: every decision of the retraining job's promotion gate, with its reasons."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"

# Frozen copies of the schema's types: a migration must not change when the models do.
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create ``promotions`` and its (model, time) index; a new table needs no batch mode."""
    op.create_table(
        "promotions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_name", sa.String(length=200), nullable=False),
        sa.Column("candidate_version", sa.String(length=100), nullable=False),
        sa.Column("production_version", sa.String(length=100), nullable=True),
        sa.Column("decided_at", TIMESTAMP, nullable=False),
        sa.Column("promoted", sa.Boolean(), nullable=False),
        sa.Column("reasons", JSON, nullable=False),
        sa.Column("candidate_metrics", JSON, nullable=False),
        sa.Column("production_metrics", JSON, nullable=True),
        sa.Column("train_start", sa.Date(), nullable=False),
        sa.Column("train_end", sa.Date(), nullable=False),
        sa.Column("holdout_start", sa.Date(), nullable=False),
        sa.Column("holdout_end", sa.Date(), nullable=False),
        sa.Column("details", JSON, nullable=False),
        sa.CheckConstraint(
            "train_end < holdout_start", name=op.f("ck_promotions_holdout_after_train")
        ),
        sa.CheckConstraint(
            "holdout_start <= holdout_end", name=op.f("ck_promotions_holdout_ordered")
        ),
        sa.CheckConstraint("train_start <= train_end", name=op.f("ck_promotions_train_ordered")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_promotions")),
    )
    op.create_index(
        op.f("ix_promotions_model_name_decided_at"), "promotions", ["model_name", "decided_at"]
    )


def downgrade() -> None:
    """Drop the index, then the table (nothing refers to it)."""
    op.drop_index(op.f("ix_promotions_model_name_decided_at"), table_name="promotions")
    op.drop_table("promotions")
