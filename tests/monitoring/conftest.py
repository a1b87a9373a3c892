"""Databases for the trade-schema tests: a SQLite file and a real Postgres, per test.

Postgres gets its own database per test session (``allocator_test_<random>``), dropped at the
end; each test starts from an empty ``public`` schema in it. Postgres is required, not
optional: ``.ci/run`` starts it, and CI has it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.config import Config
from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import NullPool

from tests.postgres import temporary_database

REPO_ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh database for this test session, dropped (even with open sessions) at the end."""
    with temporary_database("allocator_test") as url:
        yield url


def _reset_postgres(url: str) -> None:
    """Empty the session database so every test starts without tables, views or versions."""
    engine = create_engine(url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP SCHEMA public CASCADE")
        conn.exec_driver_sql("CREATE SCHEMA public")
    engine.dispose()


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database on each backend: a SQLite file, or the session's Postgres database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'trade.db'}"
    url = request.getfixturevalue("postgres_url")
    _reset_postgres(url)
    return url


def make_alembic_config(url: str | None = None) -> Config:
    """The repository's alembic config, with logging left alone (tests share the process)."""
    config = Config(str(REPO_ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(REPO_ROOT / "migrations"))
    config.attributes["configure_logger"] = False
    if url is not None:
        config.attributes["url"] = url
    return config


@pytest.fixture
def alembic_config() -> Config:
    """pytest-alembic: the repository's migrations (it hands env.py the engine below)."""
    return make_alembic_config()


@pytest.fixture
def alembic_engine(database_url: str) -> Iterator[Engine]:
    """pytest-alembic: the database under test, on each backend."""
    engine = create_engine(database_url, poolclass=NullPool)
    try:
        yield engine
    finally:
        engine.dispose()
