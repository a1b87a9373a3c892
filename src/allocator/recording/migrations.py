"""Programmatic access to the trade-schema migrations (the CLI, the server, benches, tests).

Alembic migrations are the only path that builds the schema; this module finds them in the
repository checkout and binds them to a URL without touching the caller's logging.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

from allocator.recording.settings import database_url as default_database_url

REPO_ROOT = Path(__file__).resolve().parents[3]
"""The repository checkout: ``alembic.ini`` and ``migrations/`` ship with it, not in the wheel."""


class MigrationsNotFoundError(FileNotFoundError):
    """The migrations are not beside this installation (a wheel install, not a checkout)."""


def alembic_config(database_url: str | None = None, stdout: TextIO | None = None) -> Any:
    """An alembic ``Config`` for the repository's migrations, bound to ``database_url``
    (default: ``DATABASE_URL``, else the embedded SQLite file)."""
    from alembic.config import Config

    ini, scripts = REPO_ROOT / "alembic.ini", REPO_ROOT / "migrations"
    if not ini.is_file() or not (scripts / "env.py").is_file():
        raise MigrationsNotFoundError(
            f"migrations not found at {scripts} (and {ini}): the trade-schema migrations ship "
            "with the repository checkout; run from an editable install of it"
        )
    config = Config(str(ini), stdout=stdout or sys.stdout)
    config.set_main_option("script_location", str(scripts))
    config.attributes["url"] = database_url or default_database_url()
    config.attributes["configure_logger"] = False  # keep the caller's logging as it is
    return config


def upgrade(database_url: str | None = None, revision: str = "head") -> None:
    """Migrate the database to ``revision`` (idempotent: an up-to-date database is unchanged)."""
    from alembic import command

    command.upgrade(alembic_config(database_url), revision)
