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

from allocator.recording.migrations import alembic_config as packaged_alembic_config
from tests.postgres import reset_schema

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database on each backend: a SQLite file, or the session's Postgres database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'trade.db'}"
    url = request.getfixturevalue("postgres_url")
    reset_schema(url)
    return url


def make_alembic_config(url: str | None = None) -> Config:
    """The packaged migrations' alembic config (what `allocator db` uses), with logging left
    alone (tests share the process); env.py falls back to DATABASE_URL when ``url`` is None."""
    config = packaged_alembic_config()
    if url is None:
        del config.attributes["url"]
    else:
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
