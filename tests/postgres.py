"""A Postgres database of a test's own: created on the real server, dropped afterwards.

Postgres is required, not optional: ``.ci/run`` starts it (CI has it); the server is
``ALLOCATOR_TEST_POSTGRES`` or ``postgresql://postgres@127.0.0.1:5432/postgres``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

POSTGRES_ADMIN = os.environ.get(
    "ALLOCATOR_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def admin_connect() -> psycopg.Connection:
    try:
        return psycopg.connect(POSTGRES_ADMIN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"PostgreSQL is not reachable at {POSTGRES_ADMIN} ({exc}). The tests need it: "
            "`.ci/run` starts it (CI has it), or set ALLOCATOR_TEST_POSTGRES.",
            pytrace=False,
        )


@contextmanager
def temporary_database(prefix: str) -> Iterator[str]:
    """A fresh database's SQLAlchemy URL; dropped at the end, even with sessions open."""
    name = f"{prefix}_{secrets.token_hex(6)}"
    with admin_connect() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    info = psycopg.conninfo.conninfo_to_dict(POSTGRES_ADMIN)
    host, port, user = info.get("host", "127.0.0.1"), info.get("port", "5432"), info.get("user")
    try:
        yield f"postgresql+psycopg://{user}@{host}:{port}/{name}"
    finally:
        with admin_connect() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def reset_schema(url: str) -> None:
    """Empty a test database (drop and recreate ``public``): tables, views and versions go."""
    engine = create_engine(url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP SCHEMA public CASCADE")
        conn.exec_driver_sql("CREATE SCHEMA public")
    engine.dispose()
