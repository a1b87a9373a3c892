"""Where the trade database lives: an environment variable, an embedded SQLite default.

``ALLOCATOR_DATABASE_URL`` is the name every other setting follows (``ALLOCATOR_<SETTING>``);
``DATABASE_URL``, the name alembic, Heroku-style platforms and older deployments use, is read
when it is unset.

Kept to a plain function (no pydantic-settings) so every part of the system, the CLI, the
server and alembic's ``env.py``, resolves the URL the same way without an extra dependency.
"""

from __future__ import annotations

import os

DEFAULT_DATABASE_URL = "sqlite:///allocator.db"
"""A file in the working directory: one machine runs everything without a server."""


def database_url() -> str:
    """``ALLOCATOR_DATABASE_URL``, else ``DATABASE_URL`` (the first set and non-empty), else the
    SQLite file in the working directory."""
    for name in ("ALLOCATOR_DATABASE_URL", "DATABASE_URL"):
        url = os.environ.get(name, "").strip()
        if url:
            return url
    return DEFAULT_DATABASE_URL
