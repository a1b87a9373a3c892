"""pytest-alembic's built-in checks, on SQLite and on Postgres (``alembic_engine`` is
parametrized over both in conftest): one head, upgrade to head, models match the migrated DDL,
and every revision downgrades and upgrades again."""

from __future__ import annotations

from pytest_alembic.tests import (
    test_model_definitions_match_ddl,
    test_single_head_revision,
    test_up_down_consistency,
    test_upgrade,
)

__all__ = [
    "test_model_definitions_match_ddl",
    "test_single_head_revision",
    "test_up_down_consistency",
    "test_upgrade",
]
