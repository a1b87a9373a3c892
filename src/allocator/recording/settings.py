"""Where the trade database lives: one plain function, so the CLI, the server and alembic's
``env.py`` resolve the URL the same way."""

from __future__ import annotations

import os

DEFAULT_DATABASE_URL = "sqlite:///allocator.db"  # one machine runs everything without a server


def database_url() -> str:
    """``ALLOCATOR_DATABASE_URL``, else ``DATABASE_URL`` (the first set and non-empty), else the
    SQLite file in the working directory."""
    for name in ("ALLOCATOR_DATABASE_URL", "DATABASE_URL"):
        url = os.environ.get(name, "").strip()
        if url:
            return url
    return DEFAULT_DATABASE_URL


def shown_url(url: str) -> str:
    """``url`` with any password masked, for messages and data sources."""
    # heavy (sqlalchemy): this module stays light for the CLI's --help and alembic's env.py
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
