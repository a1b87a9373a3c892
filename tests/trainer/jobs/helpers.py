"""What the job tests (walk-forward, retraining) share: config paths, databases, addresses."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from allocator.recording.migrations import upgrade
from allocator.trainer.jobs.walk_forward.config import (
    WalkForwardConfig,
    load_walk_forward_config,
)
from tests.postgres import reset_schema

REPO_ROOT = Path(__file__).resolve().parents[3]
CONFIGS = REPO_ROOT / "configs"
TINY = CONFIGS / "walk_forward_tiny.yaml"


def tiny(tmp: Path, *extra: str) -> WalkForwardConfig:
    """The tiny walk-forward with its registry and output under ``tmp``."""
    return load_walk_forward_config(
        TINY, [f"registry={tmp / 'models'}", f"output_dir={tmp / 'out'}", *extra]
    )


def rows(url: str, sql: str) -> list[dict[str, Any]]:
    """The rows of ``sql`` as dicts, on a connection that is closed afterwards."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(sa.text(sql))]
    finally:
        engine.dispose()


def as_json(value: Any) -> Any:
    """A JSON column's value: SQLite returns text, Postgres the parsed value."""
    return json.loads(value) if isinstance(value, str) else value


def free_address() -> str:
    """``127.0.0.1:PORT`` of a port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def migrated_sqlite(folder: Path, name: str = "trade.db") -> str:
    """The URL of a new SQLite trade database in ``folder``, migrated to head."""
    url = f"sqlite:///{folder / name}"
    upgrade(url)
    return url


def remigrate(url: str) -> str:
    """Empty a Postgres database (drop and recreate ``public``) and migrate it to head."""
    reset_schema(url)
    upgrade(url)
    return url
