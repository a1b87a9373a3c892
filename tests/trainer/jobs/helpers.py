"""What the job tests (walk-forward, retraining) share: config paths, databases, addresses."""

from __future__ import annotations

import socket
from pathlib import Path

from allocator.recording.migrations import upgrade
from tests.postgres import reset_schema

REPO_ROOT = Path(__file__).resolve().parents[3]
CONFIGS = REPO_ROOT / "configs"


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
