"""Decisions carry the slot layout and the request fingerprint, so a restart can resume."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"

# Frozen copies of the schema's types: a migration must not change when the models do.
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    """Two nullable columns: rows recorded before keep NULL (a plain ADD COLUMN on both
    databases, no table rewrite, and the ``decision_weights`` view does not read them)."""
    op.add_column("decisions", sa.Column("slots", JSON, nullable=True))
    op.add_column("decisions", sa.Column("request_fingerprint", sa.String(64), nullable=True))


def downgrade() -> None:
    """Drop both columns with a plain ALTER TABLE (SQLite >= 3.35 has DROP COLUMN); batch mode
    would rebuild the table and break the ``decision_weights`` view that reads it."""
    op.drop_column("decisions", "request_fingerprint")
    op.drop_column("decisions", "slots")
