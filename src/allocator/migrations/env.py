"""Alembic environment for the trade schema.

The database URL never lives in ``alembic.ini``. In order of precedence env.py uses: a
connection handed in through ``config.attributes["connection"]`` (tests, pytest-alembic),
``config.attributes["url"]`` (the ``allocator db`` CLI), ``alembic -x url=...``, a
``sqlalchemy.url`` main option set programmatically, else ``DATABASE_URL`` via
:func:`allocator.recording.settings.database_url`.
"""

from __future__ import annotations

from logging.config import fileConfig
from typing import Any

from alembic import context
from sqlalchemy import create_engine, pool
from sqlalchemy.engine import Connection

from allocator.recording.schema import VIEWS, metadata
from allocator.recording.settings import database_url

config = context.config

if (
    config.config_file_name is not None
    and config.attributes.get("configure_logger", True)
    and "connection" not in config.attributes
):
    # Keep loggers other libraries already made: the CLI and tests live in the same process.
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Hand-written views are not in the metadata: never offer to drop them."""
    return not (type_ == "table" and name in VIEWS)


def resolve_url() -> str:
    """The URL to migrate, by the precedence in this module's docstring."""
    url = config.attributes.get("url") or context.get_x_argument(as_dictionary=True).get("url")
    return url or config.get_main_option("sqlalchemy.url") or database_url()


def run_migrations(dialect_name: str, **options: Any) -> None:
    """Configure and run in one transaction; SQLite needs batch mode to ALTER tables."""
    context.configure(
        target_metadata=metadata,
        compare_type=True,
        include_name=include_name,
        render_as_batch=dialect_name == "sqlite",
        **options,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit SQL to stdout (``alembic upgrade --sql``) without a database connection."""
    url = resolve_url()
    dialect_name = url.split(":", 1)[0].split("+", 1)[0]
    run_migrations(dialect_name, url=url, literal_binds=True, dialect_opts={"paramstyle": "named"})


def run_migrations_online() -> None:
    """Run on the handed-in connection (the caller commits), or on an engine's, committed."""
    connectable = config.attributes.get("connection")
    if isinstance(connectable, Connection):
        run_migrations(connectable.dialect.name, connection=connectable)
        return
    engine = connectable or create_engine(resolve_url(), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            run_migrations(connection.dialect.name, connection=connection)
            connection.commit()
    finally:
        if connectable is None:
            engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
