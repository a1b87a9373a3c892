"""``allocator db``: migrate the trade database with the packaged alembic migrations."""

from __future__ import annotations

from typing import Any

import click

from allocator.cli.options import database_url_option, emit_json, failing, json_options
from allocator.recording.migrations import MigrationsNotFoundError, alembic_config
from allocator.recording.settings import shown_url


@click.group()
def db() -> None:
    """Migrate the trade database (alembic; the migrations ship inside the package)."""


@db.command("upgrade")
@click.argument("revision", default="head")
@database_url_option
def db_upgrade(revision: str, database_url: str | None) -> None:
    """Upgrade the trade schema to REVISION (default: head)."""
    from alembic import command  # heavy (sqlalchemy): keeps --help instant

    with failing(MigrationsNotFoundError):
        config = alembic_config(database_url)
    command.upgrade(config, revision)
    click.echo(f"upgraded {shown_url(config.attributes['url'])} to {revision}")


@db.command("downgrade")
@click.argument("revision")
@database_url_option
def db_downgrade(revision: str, database_url: str | None) -> None:
    """Downgrade the trade schema to REVISION ('base' removes it all)."""
    from alembic import command  # heavy (sqlalchemy): keeps --help instant

    with failing(MigrationsNotFoundError):
        config = alembic_config(database_url)
    command.downgrade(config, revision)
    click.echo(f"downgraded {shown_url(config.attributes['url'])} to {revision}")


@db.command("current")
@database_url_option
@json_options
def db_current(database_url: str | None, as_json: bool, json_out: str | None) -> None:
    """Print the revision the trade database is at (nothing when it has none)."""
    from alembic import command  # heavy (sqlalchemy): keeps --help instant

    with failing(MigrationsNotFoundError):
        config = alembic_config(database_url)
    if as_json or json_out:
        emit_json(current_revisions(config), as_json, json_out)
        if as_json:
            return
    click.echo(f"database: {shown_url(config.attributes['url'])}")
    command.current(config)


def current_revisions(config: Any) -> dict[str, Any]:
    """The database's revisions (none before the first upgrade) and the migrations' head."""
    # heavy (sqlalchemy, alembic): only when the command runs
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from sqlalchemy import create_engine

    url = config.attributes["url"]
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            current = list(MigrationContext.configure(connection).get_current_heads())
    finally:
        engine.dispose()
    head = ScriptDirectory.from_config(config).get_current_head()
    return {"database": shown_url(url), "revisions": current, "head": head}
