"""``allocator db``: migrate the trade database with the packaged alembic migrations.

The alembic configuration comes from :mod:`allocator.recording.migrations` (the one place that
finds the migrations and binds them to a URL); alembic itself (with sqlalchemy) is imported inside
the commands, so ``allocator --help`` stays instant.
"""

from __future__ import annotations

from typing import Any

import click

from allocator.cli.options import database_url_option, fail, shown_url
from allocator.recording.migrations import MigrationsNotFoundError, alembic_config


@click.group()
def db() -> None:
    """Migrate the trade database (alembic; the migrations ship inside the package)."""


def bound_config(database_url: str | None) -> Any:
    """The migrations' alembic ``Config`` for ``database_url``; exit 2 when they are missing.

    alembic writes to the ``sys.stdout`` in use when the command runs (what a test captures)."""
    try:
        return alembic_config(database_url)
    except MigrationsNotFoundError as exc:
        fail(f"{exc}")


@db.command("upgrade")
@click.argument("revision", default="head")
@database_url_option
def db_upgrade(revision: str, database_url: str | None) -> None:
    """Upgrade the trade schema to REVISION (default: head)."""
    from alembic import command  # heavy (sqlalchemy): keeps --help instant

    config = bound_config(database_url)
    command.upgrade(config, revision)
    click.echo(f"upgraded {shown_url(config.attributes['url'])} to {revision}")


@db.command("downgrade")
@click.argument("revision")
@database_url_option
def db_downgrade(revision: str, database_url: str | None) -> None:
    """Downgrade the trade schema to REVISION ('base' removes it all)."""
    from alembic import command  # heavy (sqlalchemy): keeps --help instant

    config = bound_config(database_url)
    command.downgrade(config, revision)
    click.echo(f"downgraded {shown_url(config.attributes['url'])} to {revision}")


@db.command("current")
@database_url_option
def db_current(database_url: str | None) -> None:
    """Print the revision the trade database is at (nothing when it has none)."""
    from alembic import command  # heavy (sqlalchemy): keeps --help instant

    config = bound_config(database_url)
    click.echo(f"database: {shown_url(config.attributes['url'])}")
    command.current(config)
