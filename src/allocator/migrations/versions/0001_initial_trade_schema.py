"""Initial trade schema: model versions, decisions, training and walk-forward runs.

Also creates the ``decision_weights`` view (one row per decision and asset) that Grafana
queries; views are not in the SQLAlchemy metadata, so its SQL is written here per dialect.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None

# Frozen copies of the schema's types: a migration must not change when the models do.
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TIMESTAMP = sa.DateTime(timezone=True)

# Weight arrays are parallel to asset_ids: position i of each belongs to asset_ids[i].
DECISION_WEIGHTS_POSTGRESQL = """
CREATE VIEW decision_weights AS
SELECT
    d.id AS decision_id,
    d.portfolio_id,
    d.decided_at,
    d.model_version_id,
    (a.ordinality - 1)::integer AS position,
    a.asset_id,
    (d.raw_weights ->> (a.ordinality - 1)::integer)::double precision AS raw_weight,
    (d.smoothed_weights ->> (a.ordinality - 1)::integer)::double precision AS smoothed_weight
FROM decisions AS d
CROSS JOIN LATERAL jsonb_array_elements_text(d.asset_ids) WITH ORDINALITY AS a(asset_id, ordinality)
"""

DECISION_WEIGHTS_SQLITE = """
CREATE VIEW decision_weights AS
SELECT
    d.id AS decision_id,
    d.portfolio_id,
    d.decided_at,
    d.model_version_id,
    CAST(a.key AS INTEGER) AS position,
    a.value AS asset_id,
    CAST(json_extract(d.raw_weights, '$[' || a.key || ']') AS REAL) AS raw_weight,
    CAST(json_extract(d.smoothed_weights, '$[' || a.key || ']') AS REAL) AS smoothed_weight
FROM decisions AS d, json_each(d.asset_ids) AS a
"""


def upgrade() -> None:
    """Create the tables, their indexes and the per-asset view."""
    # long: the whole initial schema in one released revision; history is never rewritten
    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("version", sa.String(length=100), nullable=False),
        sa.Column("algorithm", sa.String(length=50), nullable=False),
        sa.Column("manifest", JSON, nullable=False),
        sa.Column("checksums", JSON, nullable=False),
        sa.Column("created", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_versions")),
        sa.UniqueConstraint("name", "version", name=op.f("uq_model_versions_name_version")),
    )
    op.create_table(
        "training_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("algorithm", sa.String(length=50), nullable=False),
        sa.Column("run_dir", sa.String(length=1000), nullable=False),
        sa.Column("config", JSON, nullable=False),
        sa.Column("metrics", JSON, nullable=True),
        sa.Column("started", TIMESTAMP, nullable=False),
        sa.Column("finished", TIMESTAMP, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_training_runs")),
    )
    op.create_table(
        "walk_forward_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("config", JSON, nullable=False),
        sa.Column("started", TIMESTAMP, nullable=False),
        sa.Column("finished", TIMESTAMP, nullable=True),
        sa.Column("summary", JSON, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_walk_forward_runs")),
    )
    op.create_table(
        "decisions",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("request_id", sa.String(length=200), nullable=False),
        sa.Column("portfolio_id", sa.String(length=200), nullable=False),
        sa.Column("decided_at", TIMESTAMP, nullable=False),
        sa.Column("model_version_id", sa.Integer(), nullable=False),
        sa.Column("asset_ids", JSON, nullable=False),
        sa.Column("raw_weights", JSON, nullable=False),
        sa.Column("smoothed_weights", JSON, nullable=False),
        sa.Column("current_weights", JSON, nullable=True),
        sa.Column("turnover", sa.Float(), nullable=False),
        sa.Column("icm_reward", sa.Float(), nullable=True),
        sa.Column("latency_seconds", sa.Float(), nullable=False),
        sa.CheckConstraint("latency_seconds >= 0", name=op.f("ck_decisions_latency_nonnegative")),
        sa.CheckConstraint("turnover >= 0", name=op.f("ck_decisions_turnover_nonnegative")),
        sa.ForeignKeyConstraint(
            ["model_version_id"],
            ["model_versions.id"],
            name=op.f("fk_decisions_model_version_id_model_versions"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_decisions")),
        sa.UniqueConstraint("request_id", name=op.f("uq_decisions_request_id")),
    )
    op.create_index(op.f("ix_decisions_decided_at"), "decisions", ["decided_at"])
    op.create_index(op.f("ix_decisions_model_version_id"), "decisions", ["model_version_id"])
    op.create_index(
        op.f("ix_decisions_portfolio_id_decided_at"), "decisions", ["portfolio_id", "decided_at"]
    )
    op.create_table(
        "walk_forward_windows",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("train_start", sa.Date(), nullable=False),
        sa.Column("train_end", sa.Date(), nullable=False),
        sa.Column("test_start", sa.Date(), nullable=False),
        sa.Column("test_end", sa.Date(), nullable=False),
        sa.Column("model_version_id", sa.Integer(), nullable=True),
        sa.Column("metrics", JSON, nullable=False),
        sa.Column("baseline_metrics", JSON, nullable=False),
        sa.Column("icm_stats", JSON, nullable=True),
        sa.CheckConstraint(
            "test_start <= test_end", name=op.f("ck_walk_forward_windows_test_ordered")
        ),
        sa.CheckConstraint(
            "train_start <= train_end", name=op.f("ck_walk_forward_windows_train_ordered")
        ),
        sa.ForeignKeyConstraint(
            ["model_version_id"],
            ["model_versions.id"],
            name=op.f("fk_walk_forward_windows_model_version_id_model_versions"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["walk_forward_runs.id"],
            name=op.f("fk_walk_forward_windows_run_id_walk_forward_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_walk_forward_windows")),
        sa.UniqueConstraint("run_id", "index", name=op.f("uq_walk_forward_windows_run_id_index")),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(DECISION_WEIGHTS_POSTGRESQL)
    else:
        op.execute(DECISION_WEIGHTS_SQLITE)


def downgrade() -> None:
    """Drop the view first (it depends on ``decisions``), then the tables in FK order."""
    op.execute("DROP VIEW IF EXISTS decision_weights")
    op.drop_table("walk_forward_windows")
    op.drop_index(op.f("ix_decisions_portfolio_id_decided_at"), table_name="decisions")
    op.drop_index(op.f("ix_decisions_model_version_id"), table_name="decisions")
    op.drop_index(op.f("ix_decisions_decided_at"), table_name="decisions")
    op.drop_table("decisions")
    op.drop_table("walk_forward_runs")
    op.drop_table("training_runs")
    op.drop_table("model_versions")
