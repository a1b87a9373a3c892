"""Where the trade database lives: one environment variable, an embedded SQLite default.

Kept to a plain function (no pydantic-settings) so every part of the system, the CLI, the
server and alembic's ``env.py``, resolves the URL the same way without an extra dependency.
"""

from __future__ import annotations

import os

DEFAULT_DATABASE_URL = "sqlite:///allocator.db"
"""A file in the working directory: one machine runs everything without a server."""


def database_url() -> str:
    """``DATABASE_URL`` when set and non-empty, else the SQLite file in the working directory."""
    return os.environ.get("DATABASE_URL", "").strip() or DEFAULT_DATABASE_URL
