"""Durable file writes: the one place that knows how a write survives a crash.

A file a reader must see whole or not at all is written to a temporary file in the same
directory, fsync'd, renamed over the target (atomic on one file system), and then the directory
is fsync'd: a rename is durable only once its directory's entries are.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_MODE = 0o644
"""Mode of atomically written files: ``mkstemp`` makes 0600, but other users (a server running
as another account) read registries and run directories."""


def fsync_path(path: str | Path) -> None:
    """Flush ``path`` to disk: a file's contents (e.g. after ``shutil.copyfile``), or a
    directory's entries (a file created, renamed or deleted in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_with(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Replace ``path`` with the file ``write(tmp)`` creates, so a reader sees the old file or
    the new one, never a mix. The temporary ``.STEM-XXXX.SUFFIX`` is hidden from listings that
    skip dot-names and keeps the suffix a writer might append (SB3's ``save``)."""
    target = Path(path)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}-", suffix=target.suffix)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.chmod(tmp, DEFAULT_MODE)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(target.parent)
    return target


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    return atomic_write_with(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def _clean(obj: Any) -> Any:
    """NaN and infinities are not JSON: write them as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return _clean(obj.item())
    return obj


def json_text(payload: Any) -> str:
    """``payload`` as indented JSON that strict readers (browsers, Grafana, jq) accept."""
    return json.dumps(_clean(payload), indent=2, default=str)


def write_json(path: str | Path, payload: Any) -> Path:
    """Write ``payload`` as ``json_text``, creating parent folders."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json_text(payload) + "\n")
    return out
