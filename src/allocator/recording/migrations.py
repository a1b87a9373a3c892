"""The trade-schema migrations, bound to a URL without touching the caller's logging. They ship
inside the package (``allocator/migrations``), so a wheel install migrates as a checkout does."""

from __future__ import annotations

import sys
from importlib.resources import files
from typing import Any, TextIO

from allocator.recording.settings import database_url as default_database_url

SCRIPT_LOCATION = "allocator:migrations"  # alembic's package-resource form


class MigrationsNotFoundError(FileNotFoundError):
    """The installed package lacks its migrations (a build that left the package data out)."""


def alembic_config(database_url: str | None = None, stdout: TextIO | None = None) -> Any:
    """An alembic ``Config`` for the packaged migrations, bound to ``database_url``
    (default: ``DATABASE_URL``, else the embedded SQLite file)."""
    from alembic.config import Config

    package, _, directory = SCRIPT_LOCATION.partition(":")
    try:
        found = files(package).joinpath(directory, "env.py").is_file()
    except ModuleNotFoundError:
        found = False
    if not found:
        raise MigrationsNotFoundError(
            f"migrations not found at {SCRIPT_LOCATION} (no env.py there): the trade-schema "
            "migrations ship inside the allocator package; reinstall it from a complete wheel"
        )
    config = Config(stdout=stdout or sys.stdout)
    config.set_main_option("script_location", SCRIPT_LOCATION)
    config.set_main_option("path_separator", "os")
    config.attributes["url"] = database_url or default_database_url()
    config.attributes["configure_logger"] = False  # keep the caller's logging as it is
    return config


def upgrade(database_url: str | None = None, revision: str = "head") -> None:
    """Migrate the database to ``revision`` (idempotent: an up-to-date database is unchanged)."""
    from alembic import command

    command.upgrade(alembic_config(database_url), revision)
